"""Loading users' designs from a Python file (`--design-file FILE.py`).

The file is ordinary Python that builds ``emu.designs.Design`` objects; every Design bound
at module level (or listed in a module-level ``DESIGNS`` sequence) is validated and
registered under its name, in the order the file defines them.

The file runs in a child process, bounded in time and memory: whatever it does (raise BaseException,
call os._exit or sys.exit, loop forever, allocate without end) is reported in one line, not obeyed.
The child sends back the designs it found, as a pickle that only Design and its parts may be built
from.
"""

from __future__ import annotations

import io
import os
import pickle
import resource
import runpy
import select
import signal
import time
import traceback
from collections.abc import Iterable

from emu.designs import BUILTIN, Design, DesignError, register, shape_problems

LOAD_TIMEOUT_S = 30.0  # a design file's run, by default (--timeout, where a command has one, bounds it instead)
LOAD_MEMORY = 2 << 30  # bytes of address space the child may add to what it inherits from the fork
_PICKLED_FROM = {  # what a design file's child may send back: the design API's records, nothing else
    "emu.designs": {"Design", "Patch", "Trampoline", "Handler", "ReturnTrampoline"},
    "emu.designs.choices": None,  # any of its enums
    "copyreg": {"_reconstructor", "__newobj__"},
    "builtins": {"tuple", "frozenset", "set", "object", "int", "str", "bytes", "list", "dict"},
}


def _found(namespace: dict[str, object]) -> list[Design]:
    candidates: list[object] = list(namespace.values())
    listed = namespace.get("DESIGNS")
    if isinstance(listed, list | tuple):
        candidates += list(listed)
    unique: dict[int, Design] = {}
    for value in candidates:
        if isinstance(value, Design) and not any(value is b for b in BUILTIN):  # `base = DESIGNS[...]` is a reference
            unique.setdefault(id(value), value)
    return list(unique.values())


def _where(path: str, err: BaseException) -> str:
    """``path:line`` of the deepest frame of ``err`` inside the design file."""
    frames = [f for f in traceback.extract_tb(err.__traceback__) if os.path.abspath(f.filename) == os.path.abspath(path)]
    return f"{path}:{frames[-1].lineno}" if frames else path


def _label(design: Design) -> str:
    return repr(design.name) if isinstance(design.name, str) else "(unnamed)"


def _run(path: str) -> list[Design]:
    """Run the design file here (in the child) and find its designs; DesignError says how it failed."""
    try:
        namespace = runpy.run_path(path, run_name="uprobe_emu_design")
    except SyntaxError as err:
        raise DesignError(f"{path}:{err.lineno}: syntax error: {err.msg}") from None
    except SystemExit as err:  # the file's own sys.exit() must not end the tool (with its status) unnoticed
        raise DesignError(f"{_where(path, err)}: the design file called sys.exit({err.code!r})") from None
    except BaseException as err:  # the user's code, KeyboardInterrupt and friends too: where it failed, in one line
        raise DesignError(f"{_where(path, err)}: {type(err).__name__}: {err}") from None
    return _found(namespace)


class _DesignUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> object:
        allowed = _PICKLED_FROM.get(module, set())
        if allowed is not None and name not in allowed:
            raise pickle.UnpicklingError(f"{module}.{name} is not part of a design")
        return super().find_class(module, name)


def _child(path: str, timeout_s: float, out: int) -> None:
    """In the forked child: bounded, run the file, send back (designs, None) or (None, error); never return."""
    status = 0
    try:
        with open("/proc/self/statm") as statm:  # what the fork inherited (a test run's engines reserve much)
            inherited = int(statm.read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (inherited + LOAD_MEMORY, inherited + LOAD_MEMORY))
        resource.setrlimit(resource.RLIMIT_CPU, (int(timeout_s) + 1, int(timeout_s) + 2))
        try:
            designs = _run(path)
            try:
                payload = pickle.dumps((designs, None))
            except Exception as err:  # a class of the file's own, a lambda in a field: not plain design data
                payload = pickle.dumps((None, f"{path}: the designs are not plain Design objects "
                                              f"({type(err).__name__}: {err})"))
        except DesignError as err:
            payload = pickle.dumps((None, str(err)))
        with os.fdopen(out, "wb") as fh:
            fh.write(payload)
    except BaseException:  # nothing may escape the child: the parent reports its end
        status = 70
    os._exit(status)


def _in_child(path: str, timeout_s: float) -> list[Design]:
    """Run ``path`` in a child process bounded by ``timeout_s`` and LOAD_MEMORY; its designs."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's coverage is its result
        os.close(read)
        _child(path, timeout_s, write)
    os.close(write)
    data = bytearray()
    deadline = time.monotonic() + timeout_s
    with os.fdopen(read, "rb") as fh:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fh], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise DesignError(f"{path}: the design file ran past {timeout_s:g} s (stopped)")
            chunk = os.read(fh.fileno(), 1 << 16)
            if not chunk:
                break
            data += chunk
    _pid, status = os.waitpid(pid, 0)
    if not data:
        raise DesignError(f"{path}: the design file ended the process it ran in ({_how(status)})")
    try:
        designs, error = _DesignUnpickler(io.BytesIO(bytes(data))).load()
    except Exception as err:  # a file that wrote into the pipe itself, or sent something that is not a design
        raise DesignError(f"{path}: the design file's result is not a list of designs ({err})") from None
    if error is not None:
        raise DesignError(error)
    if not isinstance(designs, list) or not all(isinstance(d, Design) for d in designs):
        raise DesignError(f"{path}: the design file's result is not a list of designs")
    return designs


def _how(status: int) -> str:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        why = " (its CPU time ran out)" if sig == signal.SIGXCPU else " (its memory ran out)" if sig == signal.SIGKILL else ""
        return f"killed by {signal.Signals(sig).name}{why}"
    code = os.WEXITSTATUS(status)
    return "exit status 70: it ran out of memory, or raised where nothing could catch it" if code == 70 \
        else f"it called os._exit({code})"


def load_design_file(path: str, timeout_s: float | None = None) -> list[Design]:
    """Run ``path`` (in a child process, within ``timeout_s``, default LOAD_TIMEOUT_S), then validate and
    register the designs it defines. DesignError (one line) if anything is wrong."""
    if not os.path.isfile(path):
        raise DesignError(f"--design-file {path}: no such file")
    designs = _in_child(path, timeout_s or LOAD_TIMEOUT_S)
    if not designs:
        raise DesignError(f"{path}: defines no Design (build one with emu.designs.Design(...))")
    for design in designs:  # types and sizes before anything else looks at a field
        shape = shape_problems(design)
        if shape:
            raise DesignError(f"{path}: design {_label(design)}: " + "; ".join(shape))
    names = [d.name for d in designs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise DesignError(f"{path}: two designs are named {', '.join(map(repr, duplicates))}")
    return [register(d, os.path.abspath(path)) for d in designs]


def load_design_files(paths: Iterable[str], timeout_s: float | None = None) -> list[Design]:
    return [design for path in paths for design in load_design_file(path, timeout_s)]
