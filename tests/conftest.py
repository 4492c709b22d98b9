"""Shared fixtures: where the samples are, and how to run one command natively and under emulation.

``run_emulated`` and ``run_native`` take the same argv/env/cwd/stdin and give back the
same shape (``Outcome``), so a test can compare them field by field. A native death
by signal (returncode -signo) is reported as 128+signo, the way the emulator reports it.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest

from emu.cpu import Reg
from emu.designs import forget_user_designs
from emu.guestio import GuestIO
from emu.kernel.dispatch import KernelConfig
from emu.kernel.uprobes.consumers import Consumer
from emu.machine import Attachment, Machine, RunOptions, RunResult

if TYPE_CHECKING:
    from emu.survey.engine import Outcome as SurveyOutcome


def built_extension(symbol: str) -> ModuleType | None:
    """The C extension, whatever UPROBE_EMU_PURE_PYTHON says (a test of a C twin runs in both modes),
    if it is built and has ``symbol``."""
    try:
        module = importlib.import_module("emu._hotpath")
    except ImportError:
        return None
    return module if hasattr(module, symbol) else None

REPO = Path(__file__).resolve().parent.parent
SAMPLES_DIR = REPO / "elf_samples"
FIXTURES_DIR = REPO / "fixtures"

# A small, fixed environment: both sides get exactly this (nothing leaks in from the test runner).
DEFAULT_ENV: dict[str, str] = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LC_ALL": "C",
    "HOME": "/nonexistent",
    "TZ": "UTC",
}

NATIVE_TIMEOUT_S = 60
EMULATED_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Outcome:
    """What a caller of the program can observe: output streams and exit status (128+signo if killed)."""

    out: bytes
    err: bytes
    status: int
    pid: int | None = None
    result: RunResult | None = field(default=None, compare=False)

    def observed(self) -> tuple[bytes, bytes, int]:
        """The fields a native run and an emulated run must agree on."""
        return self.out, self.err, self.status


def sample(name: str) -> str:
    path = SAMPLES_DIR / name
    assert path.is_file(), f"missing sample {path}"
    return str(path)


def benchmark_script(name: str) -> ModuleType:
    """benchmarks/NAME.py imported as a module (a script there puts benchmarks/ on sys.path itself)."""
    path = Path(__file__).resolve().parent.parent / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _resolve_program(argv: Sequence[str], env: Mapping[str, str]) -> str:
    prog = argv[0]
    if "/" in prog:
        return prog
    found = shutil.which(prog, path=env.get("PATH", os.defpath))
    assert found is not None, f"{prog} not found on PATH"
    return found


def run_emulated(argv: Sequence[str], env: Mapping[str, str] | None = None, *,
                 cwd: str | os.PathLike[str] | None = None, stdin: bytes = b"", exe: str | None = None,
                 **opts: Any) -> Outcome:
    """Run ``argv`` under the emulator. ``opts`` go to RunOptions; ``rootfs``/``seed``/``pid`` etc. to KernelConfig."""
    env = dict(DEFAULT_ENV if env is None else env)
    kernel_fields = set(KernelConfig.__dataclass_fields__)
    kernel_opts = {k: opts.pop(k) for k in list(opts) if k in kernel_fields}
    kernel = KernelConfig(cwd=str(cwd) if cwd is not None else os.getcwd(), **kernel_opts)
    opts.setdefault("timeout_s", EMULATED_TIMEOUT_S)
    options = RunOptions(kernel=kernel, **opts)
    io = GuestIO.captured(stdin)
    machine = Machine(exe or _resolve_program(argv, env), list(argv), env, options, io)
    result = machine.run()
    return Outcome(bytes(io.out), bytes(io.err), result.exit_status, kernel.pid, result)


def _no_aslr() -> None:
    import ctypes

    from emu.native import ADDR_NO_RANDOMIZE

    ctypes.CDLL(None).personality(ADDR_NO_RANDOMIZE)


def run_native(argv: Sequence[str], env: Mapping[str, str] | None = None, *,
               cwd: str | os.PathLike[str] | None = None, stdin: bytes = b"", no_aslr: bool = False) -> Outcome:
    """Run ``argv`` on the host with exactly ``env``; a death by signal N becomes status 128+N.
    ``no_aslr``: personality(ADDR_NO_RANDOMIZE) as `setarch -R`, the layout an emulated run has."""
    env = dict(DEFAULT_ENV if env is None else env)
    proc = subprocess.Popen(list(argv), executable=_resolve_program(argv, env), env=env, cwd=cwd,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=_no_aslr if no_aslr else None)
    out, err = proc.communicate(stdin, timeout=NATIVE_TIMEOUT_S)
    status = proc.returncode
    return Outcome(out, err, 128 - status if status < 0 else status, proc.pid)


@pytest.fixture(scope="session")
def samples_dir() -> Path:
    return SAMPLES_DIR


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    return FIXTURES_DIR


@pytest.fixture
def emulate() -> Any:
    return run_emulated


@pytest.fixture
def native() -> Any:
    return run_native


# --------------------------------------------------------------------------- kernel driven call by call
SYSCALL_ARG_REGS = (Reg.RDI, Reg.RSI, Reg.RDX, Reg.R10, Reg.R8, Reg.R9)
SCRATCH_BELOW_SP = 1 << 20  # guest scratch memory for strings and buffers: inside [stack], far below sp


class GuestKernel:
    """A Machine built (memory, stack, stdio) but not run, whose kernel is driven one syscall at a time.

    Calls go through the real entry, ``Kernel.on_syscall``: registers in, -errno out, unknown
    numbers recorded, exactly as for a running guest. Strings and buffers live in the guest's
    own stack mapping.
    """

    def __init__(self, path: str | None = None, argv: Sequence[str] | None = None,
                 env: Mapping[str, str] | None = None, stdin: bytes = b"", **kernel_opts: Any) -> None:
        path = path or sample("hello_static")
        self.io = GuestIO.captured(stdin)
        kernel_opts.setdefault("cwd", str(REPO))
        options = RunOptions(kernel=KernelConfig(**kernel_opts))
        self.machine = Machine(path, list(argv or [path]), dict(env or {}), options, self.io)
        self.kernel = self.machine.kernel
        self.mem = self.machine.mem
        self._next = self.machine.entry_sp - SCRATCH_BELOW_SP
        assert self.mem.grow_stack(self._next)  # the scratch area is stack the guest touched: it grew there
        self._numbers = {row.name: nr for nr, row in self.kernel.table.items()}

    def alloc(self, size: int, data: bytes = b"") -> int:
        addr = self._next
        self._next += (max(size, len(data)) + 15) & ~15
        self.mem.write(addr, data.ljust(size, b"\0"))
        return addr

    def cstr(self, text: str | bytes) -> int:
        raw = os.fsencode(text) if isinstance(text, str) else text
        return self.alloc(len(raw) + 1, raw + b"\0")

    def read(self, addr: int, size: int) -> bytes:
        return self.mem.read(addr, size)

    def nr(self, name: str) -> int:
        return self._numbers[name]

    def __call__(self, name_or_nr: str | int, *args: int) -> int:
        """One system call; returns rax as a signed number (-errno on failure)."""
        nr = self.nr(name_or_nr) if isinstance(name_or_nr, str) else name_or_nr
        cpu = self.machine.cpu
        cpu.write(Reg.RAX, nr)
        for reg, value in zip(SYSCALL_ARG_REGS, args, strict=False):
            cpu.write(reg, value)
        self.kernel.on_syscall()
        ret = cpu.read(Reg.RAX)
        return ret - (1 << 64) if ret >= 1 << 63 else ret

    def open(self, path: str, flags: int = 0, mode: int = 0, dirfd: int = -100) -> int:
        return self("openat", dirfd & 0xFFFFFFFF, self.cstr(path), flags, mode)

    def read_fd(self, fd: int, size: int = 65536) -> bytes:
        buf = self.alloc(size)
        n = self("read", fd, buf, size)
        assert n >= 0, f"read({fd}) failed: {n}"
        return self.read(buf, n)

    def slurp(self, path: str) -> bytes:
        fd = self.open(path)
        assert fd >= 0, f"open({path}) failed: {fd}"
        chunks = []
        while chunk := self.read_fd(fd):
            chunks.append(chunk)
        assert self("close", fd) == 0
        return b"".join(chunks)

    def readlink(self, path: str) -> str:
        buf = self.alloc(4096)
        n = self("readlink", self.cstr(path), buf, 4096)
        assert n >= 0, f"readlink({path}) failed: {n}"
        return os.fsdecode(self.read(buf, n))


@pytest.fixture
def guest() -> GuestKernel:
    return GuestKernel()


def read_file_bytes(path: str, offset: int, size: int) -> bytes:
    """``size`` bytes of the file at ``offset`` (empty if there is no such file)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read(size)
    except OSError:
        return b""


def symbol_file_offset(path: str, name: str) -> int:
    """File offset of a function or data symbol (.symtab, else .dynsym): what perf_event_open's
    probe_offset and ref_ctr_offset want."""
    import io

    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    from emu.process.elf import load_plan

    real = os.path.realpath(path)
    elf = ELFFile(io.BytesIO(Path(real).read_bytes()))
    for section in (".symtab", ".dynsym"):
        table = elf.get_section_by_name(section)
        found = table.get_symbol_by_name(name) if isinstance(table, SymbolTableSection) else None
        if found:
            offset = load_plan(real).file_offset(int(found[0]["st_value"]))
            assert offset is not None, f"{name} is not file-backed"
            return offset
    raise AssertionError(f"no symbol {name} in {path}")


def attach_exe(machine: Machine, spec: str, consumer: Consumer | None = None) -> Attachment:
    """``machine.attach`` of a spec on the executable itself, which lands at once (no LibraryProbe)."""
    att = machine.attach(spec, consumer)
    assert isinstance(att, Attachment), spec
    return att


def symtab_address(path: str, name: str) -> int:
    """Link-time address of ``name`` in the .symtab of ``path``."""
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    with open(path, "rb") as fh:
        symtab = ELFFile(fh).get_section_by_name(".symtab")
        assert isinstance(symtab, SymbolTableSection), f"{path} has no .symtab"
        found = symtab.get_symbol_by_name(name)
        assert found, f"no symbol {name} in {path}"
        return int(found[0]["st_value"])


def link_file_offset(path: str, vaddr: int) -> int:
    """File offset of a link-time address of ``path``."""
    from emu.process.elf import load_plan

    offset = load_plan(os.path.realpath(path)).file_offset(vaddr)
    assert offset is not None, f"{vaddr:#x} is not file-backed"
    return offset


@pytest.fixture(autouse=True)
def _no_user_designs_between_tests() -> Any:
    """Designs a test loads from a file stay in that test (`check --kernel all` includes them)."""
    yield
    forget_user_designs()


@contextlib.contextmanager
def python_hot_path_forced(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """As without the C extension (UPROBE_EMU_PURE_PYTHON=1): every verifier hook is Python."""
    from emu import hotpath

    with monkeypatch.context() as patch:
        patch.setattr(hotpath, "native", None)
        yield


@pytest.fixture
def python_hot_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    with python_hot_path_forced(monkeypatch):
        yield


def survey_with_corpus(tmp_path: Path, binary: str, corpus: str, designs: Sequence[Any]) -> SurveyOutcome:
    """The static survey of ``binary`` (a sample) and the runs of ``corpus`` (a fixtures/ TOML file) under
    ``designs``, in a fresh database, held against the corpus's native record: the survey's Outcome."""
    from emu.dist import InlinePool
    from emu.survey.corpus import load_corpus
    from emu.survey.engine import run_corpus, survey
    from emu.survey.native import load, record_path
    from emu.survey.store import Store, designs_key

    store = Store(str(tmp_path / "s.sqlite"), designs_key(designs))
    pool = InlinePool()
    outcome = survey([sample(binary)], designs, store, pool)
    path = str(FIXTURES_DIR / corpus)
    run_corpus(load_corpus(path), designs, store, pool, outcome, records=load(record_path(path)))
    return outcome


def seen_by_symbol(outcome: Any, design: str, sha256: str | None = None) -> dict[str, tuple[int, int, int]]:
    """What the corpus runs under ``design`` saw per site, named by symbol: (hits, hits the red-zone
    verifier flagged, hits read back); ``sha256``: only that file's sites."""
    from emu.survey.confusion import seen_sites

    names = {(sha, s.address): str(s.symbol) for sha, stored in outcome.results.items() for s in stored.sites}
    return {names[key]: (s.hits, s.flagged, s.read_back) for key, s in seen_sites(outcome, design).items()
            if sha256 is None or key[0] == sha256}
