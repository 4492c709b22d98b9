"""Named pipes (emu/kernel/fifo.py): Debian's shell, coreutils and python3 use a FIFO made with mkfifo
as they do on this machine's kernel, each script run natively and emulated, its output compared."""

from __future__ import annotations

import pytest
from conftest import Outcome, run_emulated, run_native

MADE = 'cd "$(mktemp -d)" || exit 9\nmkfifo f || exit 8\n'

SCRIPTS = {
    "what it is": "test -p f && echo is-fifo; stat -c '%F %a %s' f",
    # each open waits for the other end, whichever comes first
    "reader first": "(echo reader-first > f &); cat f",
    "writer first": "(sleep 0.01; cat f) & echo writer-first > f; wait",
    # a writer that came and went lets the waiting reader through: it reads end of file
    "a writer that only opens": "(exec 4>f; echo opened-and-closed) & cat f; wait; echo after",
    "O_NONBLOCK": "dd if=f iflag=nonblock status=none; echo read=$?\n"
                  "dd of=f oflag=nonblock status=none < /dev/null; echo write=$?",
    "O_RDWR": "exec 3<>f; echo rdwr >&3; read -r line <&3; echo \"$line\"; exec 3>&-",
    "many lines, one reader": "(seq 1 20000 > f &); sort -rn f | head -2",
    "a reader killed while it waits": "timeout 0.2 cat f; echo timeout=$?\n"
                                      "dd of=f oflag=nonblock status=none < /dev/null; echo write=$?",
}

INTERRUPTED = """
import os, signal
def alarm(*_):
    raise TimeoutError("interrupted")
signal.signal(signal.SIGALRM, alarm)
signal.setitimer(signal.ITIMER_REAL, 0.05)
try:
    os.open("f", os.O_RDONLY)
except TimeoutError as e:
    print(e)
try:
    os.open("f", os.O_WRONLY | os.O_NONBLOCK)
except OSError as e:
    print("then:", e.strerror)
"""


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_a_fifo_as_on_the_real_kernel(name: str) -> None:
    argv = ["/bin/bash", "-c", MADE + SCRIPTS[name]]
    native = run_native(argv)
    assert native.status == 0 and native.out, native
    assert _seen(run_emulated(argv)) == _seen(native)


def test_an_open_interrupted_while_it_waits_no_longer_counts() -> None:
    """EINTR (a handler without SA_RESTART) ends the waiting open: a writer then finds no reader (ENXIO)."""
    argv = ["/bin/bash", "-c", MADE + f"python3 -c '{INTERRUPTED}'"]
    native = run_native(argv)
    assert native.out == b"interrupted\nthen: No such device or address\n"
    assert _seen(run_emulated(argv)) == _seen(native)


def _seen(outcome: Outcome) -> tuple[bytes, bytes, int]:
    return outcome.out, outcome.err, outcome.status
