"""A corpus file (TOML): the command lines the dynamic half of the survey runs under every design.

    [[run]]
    name = "gzip a small file"      # optional (default: the binary and its arguments)
    binary = "/usr/bin/gzip"        # a path (relative: to the corpus file), or a name looked up in PATH
    args = ["-c", "notes.txt"]      # argv[1:]
    stdin = "text"                  # or stdin_file = "input.txt" (relative: to the corpus file)
    env = { LC_ALL = "C" }          # the guest's whole environment (default: empty)
    probes = "all sites"            # or a list of specs as check -p takes them
    timeout = 60                    # seconds per design (default 120)

"all sites" is every site the static survey finds in the binary itself, and those of every other file
its processes map (libraries.py, engine.py). Anything else (a
syntax error, an unknown key, a binary that is not there) is a usage error: one line, exit 2.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from emu.errors import UsageError

if TYPE_CHECKING:
    from emu.runtypes import RunOptions

ALL_SITES = "all sites"
DEFAULT_TIMEOUT_S = 120.0
MAX_TIMEOUT_S = 86_400.0
_KEYS = {"name", "binary", "args", "stdin", "stdin_file", "env", "probes", "timeout"}


@dataclass(frozen=True, slots=True)
class Entry:
    name: str
    binary: str  # absolute path
    args: tuple[str, ...]
    stdin: bytes
    env: tuple[tuple[str, str], ...]
    probes: tuple[str, ...] | None  # None: all sites
    timeout_s: float
    stdin_file: str | None = None  # where the stdin came from (absolute), for a command that replays the entry

    def run_key(self) -> str:
        """The entry in one survey: its content and its program (entries alike but for their binary,
        md5sum and sha1sum of the same input, map other libraries and run other code)."""
        return f"{self.content_key()}:{self.binary}"

    def content_key(self) -> str:
        """What the entry's runs depend on besides the binary's content and the design."""
        text = json.dumps({"args": self.args, "stdin": hashlib.sha256(self.stdin).hexdigest(), "env": self.env,
                           "probes": self.probes, "timeout": self.timeout_s}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@contextmanager
def run_options(entry: Entry) -> Iterator[RunOptions]:
    """How the emulation runs ``entry``: its timeout, in an empty directory of its own (as its native
    record was made: native.py), which stays empty since the guest's writes stay in memory, with the
    guest's clock starting at this host's time (as `--clock now`: ``ls -l`` of a host file shows it
    as natively, not from the future), the same for every run of the entry."""
    import time

    from emu.kernel.dispatch import KernelConfig
    from emu.runtypes import RunOptions

    with tempfile.TemporaryDirectory(prefix="uprobe-emu-entry-") as cwd:
        yield RunOptions(timeout_s=entry.timeout_s, kernel=KernelConfig(cwd=cwd, realtime_start_ns=time.time_ns()))


def load_corpus(path: str) -> list[Entry]:
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise UsageError(f"--corpus {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"--corpus {path}: not TOML ({exc})") from None
    except RecursionError:
        raise UsageError(f"--corpus {path}: not TOML (nested too deeply)") from None
    extra = set(data) - {"run"}
    if extra:
        raise UsageError(f"--corpus {path}: unknown key {sorted(extra)[0]!r} (want [[run]] tables)")
    runs = data.get("run")
    if not isinstance(runs, list) or not runs or not all(isinstance(r, dict) for r in runs):
        raise UsageError(f"--corpus {path}: no [[run]] table")
    base = os.path.dirname(os.path.abspath(path))
    return [_entry(f"--corpus {path}: run {i + 1}", run, base) for i, run in enumerate(runs)]


def _entry(where: str, run: dict[str, Any], base: str) -> Entry:
    unknown = sorted(set(run) - _KEYS)
    if unknown:
        raise UsageError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(_KEYS))})")
    binary = _binary(where, _typed(where, run, "binary", str, None), base)
    args = _typed(where, run, "args", list, [])
    env = _typed(where, run, "env", dict, {})
    if not all(isinstance(a, str) for a in args) or not all(isinstance(v, str) for v in env.values()):
        raise UsageError(f"{where}: args and env values must be strings")
    if "stdin" in run and "stdin_file" in run:
        raise UsageError(f"{where}: stdin and stdin_file both given")
    stdin = _typed(where, run, "stdin", str, "").encode("utf-8", "surrogateescape")
    stdin_file = None
    if "stdin_file" in run:
        stdin_file = os.path.join(base, _typed(where, run, "stdin_file", str, None))
        stdin = _read(where, stdin_file)
    timeout = _typed(where, run, "timeout", (int, float), DEFAULT_TIMEOUT_S)
    if not 0 < timeout <= MAX_TIMEOUT_S:  # (nan and inf too: TOML has both)
        raise UsageError(f"{where}: timeout must be more than 0 and at most {MAX_TIMEOUT_S:g} seconds")
    name = _typed(where, run, "name", str, " ".join([os.path.basename(binary), *args]))
    return Entry(name, binary, tuple(args), stdin, tuple(sorted(env.items())), _probes(where, run), float(timeout),
                 os.path.normpath(stdin_file) if stdin_file else None)


def _typed(where: str, run: dict[str, Any], key: str, kind: type | tuple[type, ...], default: Any) -> Any:
    if key not in run:
        if default is None:
            raise UsageError(f"{where}: no {key}")
        return default
    value = run[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise UsageError(f"{where}: {key} has the wrong type ({type(value).__name__})")
    return value


def _binary(where: str, text: str, base: str) -> str:
    if "\0" in text:
        raise UsageError(f"{where}: binary {text!r}: a path cannot hold a NUL")
    found = shutil.which(text) if "/" not in text else os.path.join(base, text)
    if not found or not os.path.isfile(found):
        raise UsageError(f"{where}: binary {text!r} not found")
    return os.path.abspath(found)


def _read(where: str, path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise UsageError(f"{where}: stdin_file {path}: {exc.strerror}") from None
    except ValueError as exc:  # a NUL in the name
        raise UsageError(f"{where}: stdin_file {path!r}: {exc}") from None


def _probes(where: str, run: dict[str, Any]) -> tuple[str, ...] | None:
    probes = run.get("probes", ALL_SITES)
    if probes == ALL_SITES:
        return None
    if not isinstance(probes, list) or not probes or not all(isinstance(p, str) for p in probes):
        raise UsageError(f"{where}: probes must be {ALL_SITES!r} or a list of probe specs")
    from emu.probes import parse_spec

    for spec in probes:
        parse_spec(spec)  # a bad spec is refused now, not on a worker
    return tuple(probes)


def file_sha256(path: str) -> str:
    """The sha256 of a file's content ("" if it cannot be read: no stored run or record matches it)."""
    try:
        with open(path, "rb") as fh:
            return hashlib.file_digest(fh, "sha256").hexdigest()
    except OSError:
        return ""
