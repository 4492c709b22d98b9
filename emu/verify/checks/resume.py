"""Where a hit resumes (``resume``): the handler chain ran, and the guest went on where the original
instruction alone would have taken it."""

from __future__ import annotations

from emu.verify.expected import Expected, resume_address
from emu.verify.records import Transaction, path_name, violation
from emu.violations import Check, Violation


def check_fired(tx: Transaction) -> list[Violation]:
    """A hit whose probe's handler chain never ran: the guest went past the site as if unprobed
    (a trampoline whose syscall the kernel refused, say), and the consumers missed the hit."""
    if tx.path is not None:
        return []
    return [violation(Check.RESUME, tx, "resumed without the probe firing: the consumers never ran for this hit",
                       expected="the handler chain", actual=hex(tx.end_addr), exits=tx.exits)]


def check_left(tx: Transaction) -> list[Violation]:
    """Control went from the hit's code (the site, the kernel's pages) to other code before the hit
    resumed: whatever ran there was not watched (emu/hotpath/store_watch.py). Resuming by a jump is
    no such case."""
    if tx.left is None or tx.left[1] == tx.at.next:
        return []
    pc, to = tx.left
    return [violation(Check.RESUME, tx, f"left the hit's code at {pc:#x} for {to:#x} before resuming: what ran "
                       "there went unwatched", expected=hex(tx.at.next), actual=hex(to), path=path_name(tx))]


def check_resume(tx: Transaction, exp: Expected) -> list[Violation]:
    want, got = resume_address(exp), tx.end_addr
    if want == got:
        return []
    where = ""
    if tx.site < got < tx.site + len(tx.at.original):
        where = f" (inside the probed instruction, +{got - tx.site})"
    elif got == tx.site:
        where = " (the probed instruction runs again)"
    return [violation(Check.RESUME, tx, f"resumed at {got:#x}, expected {want:#x}{where}",
                       expected=hex(want), actual=hex(got), path=path_name(tx), exits=tx.exits)]
