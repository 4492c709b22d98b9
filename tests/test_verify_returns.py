"""The uretprobe return path under the verifiers: from the function's ``ret`` into the return
trampoline until its caller runs again, every register must be as the ``ret`` alone leaves it
(but what a return handler sets), and the caller must be reached."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from emu.designs import DESIGNS, Design
from emu.guestio import GuestIO
from emu.kernel.uprobes.consumers import Consumer, Hit
from emu.machine import Machine, RunOptions
from emu.verify.session import VerifySession
from emu.violations import Check

SAMPLES = Path(__file__).resolve().parent.parent / "elf_samples"
TARGETS = str(SAMPLES / "probe_targets")
EDGE = str(SAMPLES / "uret_edge")
RET_335 = "push %rax; push %rcx; push %r11; movq $335,%rax; syscall; pop %r11; pop %rcx; {tail}ret; int3"
RET_462 = "push %rax; push %rcx; push %r11; {tail}movq $462,%rax; syscall; int3"


def _design(name: str, code: str, base: str = "linux-6.18", **fields: object) -> Design:
    ret = DESIGNS[base].uretprobe
    return replace(DESIGNS[base], name=name, uretprobe=replace(ret, code=code, **fields))  # type: ignore[arg-type]


def _verified(design: str | Design, path: str, specs: list[str], *args: str,
              consumer: Consumer | None = None) -> tuple[VerifySession, bytes, int]:
    io = GuestIO.captured()
    m = Machine(path, [path, *args], {}, RunOptions(design=design), io)
    for spec in specs:
        m.attach(spec, consumer)
    session = VerifySession(m)
    result = m.run()
    session.finish(result.message or result.ending.value, killed=result.signal is not None)
    return session, bytes(io.out), result.exit_status


@pytest.mark.parametrize("tail, flaw", [("mov $0x5a,%rdx; ", "rdx expected"), ("pcmpeqd %xmm15,%xmm15; ", "xmm15 expected"),
                                         ("std; ", "DF=1"), ("", None)])
def test_a_335_return_trampoline_that_changes_a_register(tail: str, flaw: str | None) -> None:
    session, _, status = _verified(_design("ret-flaw", RET_335.format(tail=tail)), TARGETS, ["uretprobe:t_push"], "3")
    regs = [v for v in session.violations if v.kind is Check.REGS]
    if flaw is None:  # the control: linux-6.18's own trampoline, returns checked and clean
        assert session.violations == [] and session.returns.count == 3 and status == 0
        return
    # at least the first return (a register the program never sets again stays changed: later returns start so)
    assert regs and all(flaw in v.line() and "uretprobe:t_push (return)" in v.line() for v in regs), regs


def test_a_462_return_trampoline_that_changes_a_register_before_its_syscall() -> None:
    """The RFC's trampoline IRETs from the saved registers: a register changed before the syscall stays changed."""
    flawed = _design("ret-rfc-flaw", RET_462.format(tail="mov $0x5a,%r8; "), base="uretprobe-rfc")
    session, _, _ = _verified(flawed, TARGETS, ["uretprobe:t_push"], "3")
    assert session.violations and all(v.kind is Check.REGS and "r8 expected" in v.line() for v in session.violations)
    clean, _, _ = _verified("uretprobe-rfc", TARGETS, ["uretprobe:t_push"], "3")
    assert clean.violations == [] and clean.returns.count == 3


def test_a_return_trampoline_that_loses_the_return_address_never_resumes() -> None:
    lost = _design("ret-lost", RET_335.format(tail="lea 8(%rsp),%rsp; "))
    session, _, status = _verified(lost, TARGETS, ["uretprobe:t_push"], "3")
    resume = [v for v in session.violations if v.kind is Check.RESUME]
    assert status != 0 and resume and "never reached its caller" in resume[0].line()


def test_what_a_return_handler_sets_is_the_reference() -> None:
    def set_ax(hit: Hit) -> None:
        hit.regs.ax = 0x4242

    session, _, _ = _verified("linux-6.18", EDGE, ["uretprobe:leaf"], "longjmp", "3", consumer=Consumer(ret_handler=set_ax))
    assert session.violations == [] and session.returns.count == 2
    flawed = _design("ret-flaw", RET_335.format(tail="mov $0x5a,%rdx; "))
    session, _, _ = _verified(flawed, EDGE, ["uretprobe:leaf"], "longjmp", "3", consumer=Consumer(ret_handler=set_ax))
    assert [v.kind for v in session.violations] == [Check.REGS] * 2
    assert all("rdx" in v.line() and "rax" not in v.line() for v in session.violations)


@pytest.mark.parametrize("design", list(DESIGNS))
@pytest.mark.parametrize("args, specs", [(("depth", "70"), ["uretprobe:rec"]),
                                         (("chain", "5"), ["uretprobe:chain_a", "uretprobe:chain_b"]),
                                         (("longjmp", "5"), ["uretprobe:lj", "uretprobe:leaf"])])
def test_built_in_designs_return_clean(design: str, args: tuple[str, ...], specs: list[str]) -> None:
    """Nested, chained (one trampoline return for two instances) and longjmp'd-over returns."""
    session, _, status = _verified(design, EDGE, specs, *args)
    assert status == 0 and session.violations == [] and session.returns.count > 0


def test_every_return_is_verified_however_many_the_c_front_takes() -> None:
    """With the C extension the optimized entry's hijack and the return's syscall are the C front's;
    the watch still gets every return (the front hands its instances over as one lands)."""
    trig = str(SAMPLES / "trig")
    session, _, status = _verified("linux-6.18", trig, ["uretprobe:uprobe_target_nop5"], "nop5", "500")
    assert status == 0 and session.returns.count == 500
