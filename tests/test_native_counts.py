"""Parity of counts: uprobes and uretprobes on library and executable functions of Debian's own
programs fire as often emulated as under the real kernel's perf uprobes (same argv, an empty
environment, ASLR off on both sides). A count that differs means the guest saw something that
differs from native."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import symbol_file_offset

from emu.guestio import GuestIO
from emu.machine import Machine, RunOptions
from emu.native import NativeProbe, run_native
from emu.native import available as native_available

LIBC = os.path.realpath("/lib/x86_64-linux-gnu/libc.so.6")
PYTHON = os.path.realpath("/usr/bin/python3.11")
COMMANDS = {
    "ls": ["/usr/bin/ls", "/usr"],
    "sort": ["/usr/bin/sort", "/etc/services"],
    "awk": ["/usr/bin/awk", "BEGIN { for (i = 0; i < 1000; i++) s += i; print s }"],
    "seq": ["/usr/bin/seq", "100"],
    "python3.11": [PYTHON, "-c", "import json"],
}
LIBRARY_FUNCTIONS = ("malloc", "free")

pytestmark = [pytest.mark.skipif(not native_available("6.18"), reason="needs root, Linux 6.18 and the uprobe PMU"),
              pytest.mark.skipif(not Path(LIBC).exists() or not Path(PYTHON).exists(), reason="Debian's libc/python")]


def _probes(name: str) -> list[tuple[str, str, bool]]:
    """(file, function, return probe) for ``name``: libc's allocator, and python's own PyDict_New."""
    chosen = [(LIBC, fn, ret) for fn in LIBRARY_FUNCTIONS for ret in (False, True)]
    if name == "python3.11":
        chosen += [(PYTHON, "PyDict_New", False), (PYTHON, "PyDict_New", True)]
    return chosen


def _emulated(argv: list[str], probes: list[tuple[str, str, bool]]) -> tuple[bytes, int, list[int]]:
    io = GuestIO.captured()
    machine = Machine(argv[0], argv, {}, RunOptions(), io)
    attached = [machine.attach(f"{'uretprobe' if ret else 'uprobe'}:{path}:{fn}") for path, fn, ret in probes]
    result = machine.run()
    return bytes(io.out), result.exit_status, [a.consumer.hits for a in attached]


@pytest.mark.parametrize("name", list(COMMANDS))
def test_probe_counts_agree_with_the_real_kernel(name: str) -> None:
    argv, probes = COMMANDS[name], _probes(name)
    native = run_native(argv, [NativeProbe(path, symbol_file_offset(path, fn), retprobe=ret) for path, fn, ret in probes],
                        env={}, no_aslr=True)
    out, status, counts = _emulated(argv, probes)
    assert (out, status) == (native.stdout, native.returncode)
    assert dict(zip(probes, counts, strict=True)) == dict(zip(probes, native.counts, strict=True))
    assert min(native.counts) > 0  # every probe fired: a count of 0 on both sides would prove nothing


def test_a_guest_that_sees_something_else_counts_otherwise() -> None:
    """The control: two environment variables more, and python3.11 allocates a different number of times."""
    argv = COMMANDS["python3.11"]
    native = run_native(argv, [NativeProbe(LIBC, symbol_file_offset(LIBC, "malloc"))], env={}, no_aslr=True)
    io = GuestIO.captured()
    machine = Machine(argv[0], argv, {"PYTHONDONTWRITEBYTECODE": "1", "LANG": "C.UTF-8"}, RunOptions(), io)
    malloc = machine.attach(f"uprobe:{LIBC}:malloc")
    machine.run()
    assert malloc.consumer.hits != native.counts[0]
