"""The real kernel's side of a comparison: run a program natively with uprobes attached through
perf_event_open on the uprobe PMU (ctypes), and read back each probe's hit count.

Needs root (or perf_event_paranoid permitting) and /sys/bus/event_source/devices/uprobe.
"""

from __future__ import annotations

import ctypes
import os
import signal
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from emu.errors import EmuError

PMU_DIR = "/sys/bus/event_source/devices/uprobe"
NR_PERF_EVENT_OPEN = 298
PERF_ATTR_SIZE = 136
FLAG_DISABLED = 1 << 0
FLAG_ENABLE_ON_EXEC = 1 << 12
EXIT_NATIVE_UNAVAILABLE = 3

_libc = ctypes.CDLL(None, use_errno=True)


class NativeUnavailable(EmuError):
    """This machine cannot run the native side (not root, or no uprobe PMU)."""

    exit_status = EXIT_NATIVE_UNAVAILABLE


@dataclass(frozen=True, slots=True)
class NativeProbe:
    path: str
    offset: int  # file offset of the probed instruction
    retprobe: bool = False
    ref_ctr_offset: int = 0  # file offset of a USDT semaphore, 0 for none


@dataclass(frozen=True, slots=True)
class NativeRun:
    stdout: bytes
    stderr: bytes
    returncode: int
    counts: tuple[int, ...]
    site_bytes: tuple[bytes, ...] = ()  # what was at each peeked file offset when the process exited
    maps: str = ""  # its /proc/pid/maps when it exited (asked for with maps=True)
    cpu_s: float = 0.0  # the process's user + system CPU time (wait4's rusage): probe handling is system time


def available(kernel_release_prefix: str = "") -> bool:
    """Can this machine run the native side (root, the uprobe PMU, and the kernel release asked for)?"""
    try:
        uprobe_pmu_type()
    except NativeUnavailable:
        return False
    return os.geteuid() == 0 and os.uname().release.startswith(kernel_release_prefix)


def uprobe_pmu_type() -> int:
    try:
        with open(f"{PMU_DIR}/type") as fh:
            return int(fh.read())
    except OSError:
        raise NativeUnavailable("no uprobe PMU on this kernel (/sys/bus/event_source/devices/uprobe)") from None


def _attr(pmu: int, probe: NativeProbe, path_buf: ctypes.Array[ctypes.c_char]) -> ctypes.Array[ctypes.c_char]:
    config = (1 if probe.retprobe else 0) | (probe.ref_ctr_offset << 32)
    raw = struct.pack(
        "<IIQQQQQIIQQ", pmu, PERF_ATTR_SIZE, config, 0, 0, 0, FLAG_DISABLED | FLAG_ENABLE_ON_EXEC, 0, 0,
        ctypes.addressof(path_buf), probe.offset,
    )
    return ctypes.create_string_buffer(raw.ljust(PERF_ATTR_SIZE, b"\0"), PERF_ATTR_SIZE)


def _open_event(pmu: int, probe: NativeProbe, pid: int) -> int:
    path_buf = ctypes.create_string_buffer(os.fsencode(probe.path))
    attr = _attr(pmu, probe, path_buf)
    fd = _libc.syscall(NR_PERF_EVENT_OPEN, attr, pid, -1, -1, 0)
    if fd < 0:
        err = ctypes.get_errno()
        raise NativeUnavailable(f"perf_event_open({probe.path}+{probe.offset:#x}): {os.strerror(err)}")
    return int(fd)


PTRACE_TRACEME, PTRACE_CONT, PTRACE_SETOPTIONS = 0, 7, 0x4200
PTRACE_O_TRACEEXIT, PTRACE_EVENT_EXIT = 0x40, 6


ADDR_NO_RANDOMIZE = 0x0040000


def _spawn_gated(argv: Sequence[str], env: dict[str, str] | None, traced: bool,
                 no_aslr: bool = False) -> tuple[int, int, int, int, int]:
    """fork; the child waits on a gate pipe, then execs (traced: stopping at exec for the parent).
    Returns pid, gate, stdin, stdout, stderr fds."""
    gate_r, gate_w = os.pipe()
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: only async-signal-safe work until exec
        try:
            os.close(gate_w)
            os.read(gate_r, 1)
            os.dup2(in_r, 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            os.closerange(3, 1 << 16)
            if no_aslr:
                _libc.personality(ADDR_NO_RANDOMIZE)
            if traced:
                _libc.ptrace(PTRACE_TRACEME, 0, None, None)
            os.execve(argv[0], list(argv), env if env is not None else dict(os.environ))
        finally:
            os._exit(127)
    for fd in (gate_r, in_r, out_w, err_w):
        os.close(fd)
    return pid, gate_w, in_w, out_r, err_r


def run_native(argv: Sequence[str], probes: Sequence[NativeProbe], env: dict[str, str] | None = None,
               stdin: bytes = b"", timeout: float = 60.0, peek: Sequence[tuple[int, int]] = (),
               no_aslr: bool = False, maps: bool = False) -> NativeRun:
    """Start ``argv`` stopped before exec, attach every probe to it, let it run, read the counts.

    ``peek``: (file offset in argv[0], length) pairs read from the process's memory when it exits
    (ptrace's exit stop), e.g. the probe sites as the kernel left them; ``maps``: its
    /proc/pid/maps there too. ``no_aslr``: personality(ADDR_NO_RANDOMIZE), as `setarch -R`, so that
    its addresses are the ones an emulated run (ASLR off by default) has."""
    pmu = uprobe_pmu_type()
    pid, gate, in_w, out_r, err_r = _spawn_gated(argv, env, traced=bool(peek) or maps, no_aslr=no_aslr)
    fds: list[int] = []
    try:
        fds = [_open_event(pmu, probe, pid) for probe in probes]
    except BaseException:
        os.kill(pid, 9)
        raise
    finally:
        os.write(gate, b"x")
        os.close(gate)
    drained: dict[str, tuple[bytes, bytes]] = {}
    drainer = threading.Thread(target=lambda: drained.setdefault("out", _drain(out_r, err_r)), daemon=True)
    drainer.start()
    try:
        with os.fdopen(in_w, "wb") as fh:
            fh.write(stdin)
        status, sites, maps_text, cpu_s = _wait(pid, argv[0], peek, maps)
        drainer.join(timeout)
        counts = tuple(struct.unpack("<Q", os.read(fd, 8))[0] for fd in fds)
    finally:
        for fd in fds:
            os.close(fd)
    out, err = drained.get("out", (b"", b""))
    returncode = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    return NativeRun(out, err, returncode, counts, sites, maps_text, cpu_s)


def _wait(pid: int, exe: str, peek: Sequence[tuple[int, int]], maps: bool) -> tuple[int, tuple[bytes, ...], str, float]:
    """Wait for the child; when traced, read the peeked bytes (and maps) at its exit stop, forward
    other signals. Returns the status, the peeked bytes, the maps and the child's CPU time."""
    sites: tuple[bytes, ...] = ()
    maps_text = ""
    exited = False
    while True:
        _, status, usage = os.wait4(pid, 0)
        if not os.WIFSTOPPED(status):
            return status, sites, maps_text, usage.ru_utime + usage.ru_stime
        sig, event = os.WSTOPSIG(status), status >> 16
        deliver = 0
        if sig == signal.SIGTRAP and event == PTRACE_EVENT_EXIT:
            exited = True
            sites = _peek(pid, exe, peek)
            if maps:
                with open(f"/proc/{pid}/maps") as fh:
                    maps_text = fh.read()
        elif sig == signal.SIGTRAP and event == 0 and not exited:
            _libc.ptrace(PTRACE_SETOPTIONS, pid, None, ctypes.c_void_p(PTRACE_O_TRACEEXIT))  # the exec stop
        else:
            deliver = sig
        _libc.ptrace(PTRACE_CONT, pid, None, ctypes.c_void_p(deliver))


def _peek(pid: int, exe: str, peek: Sequence[tuple[int, int]]) -> tuple[bytes, ...]:
    real = os.path.realpath(exe)
    maps = []
    with open(f"/proc/{pid}/maps") as fh:
        for line in fh:
            fields = line.split()
            if len(fields) >= 6 and fields[5] == real:
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                maps.append((lo, hi, int(fields[2], 16)))
    out = []
    with open(f"/proc/{pid}/mem", "rb") as mem:
        for offset, length in peek:
            addr = next((lo + offset - off for lo, hi, off in maps if off <= offset < off + hi - lo), None)
            if addr is None:
                out.append(b"")
                continue
            mem.seek(addr)
            out.append(mem.read(length))
    return tuple(out)


def _drain(out_r: int, err_r: int) -> tuple[bytes, bytes]:
    import selectors

    chunks: dict[int, bytearray] = {out_r: bytearray(), err_r: bytearray()}
    sel = selectors.DefaultSelector()
    for fd in chunks:
        sel.register(fd, selectors.EVENT_READ)
    open_fds = set(chunks)
    while open_fds:
        for key, _ in sel.select():
            data = os.read(key.fd, 65536)
            if data:
                chunks[key.fd] += data
            else:
                sel.unregister(key.fd)
                os.close(key.fd)
                open_fds.discard(key.fd)
    return bytes(chunks[out_r]), bytes(chunks[err_r])
