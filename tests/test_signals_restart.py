"""SA_RESTART: a read a signal handler interrupts starts again after it, as on Linux; without the flag
it fails with EINTR, and a poll fails with EINTR either way (elf_samples/sa_restart, natively and
emulated)."""

from __future__ import annotations

import pytest
from conftest import run_emulated, run_native, sample

SA_RESTART = sample("sa_restart")
EXPECTED = {
    "restart": b"read: 1 byte, handler ran 1 time(s)\npoll: -1 Interrupted system call\n",
    "plain": b"read: -1 Interrupted system call, handler ran 1 time(s)\npoll: -1 Interrupted system call\n",
}


@pytest.mark.parametrize("mode", sorted(EXPECTED))
def test_the_emulation_restarts_what_linux_restarts(mode: str) -> None:
    native = run_native([SA_RESTART, mode], {})
    emulated = run_emulated([SA_RESTART, mode], {})
    assert native.out == EXPECTED[mode]
    assert (emulated.out, emulated.status) == (native.out, native.status)
