"""Signal frames where the real kernel puts them, and the alternate stack as it keeps it.

elf_samples/sigframes prints, for each case, the addresses of a handler's frame and what
sigaltstack reports; natively with ASLR off and emulated (ASLR off by default), with an empty
environment, the lines must be the same."""

from __future__ import annotations

import errno
import platform
from collections.abc import Iterator

import pytest
from conftest import run_emulated, run_native, sample

import emu.kernel.hostframe as hostframe
from emu.kernel.altstack import DISABLED, MINSIGSTKSZ, SS_AUTODISARM, SS_DISABLE, SS_ONSTACK, STACK_T, AltStack, changed
from emu.kernel.errno_ import SyscallError

SIGFRAMES = sample("sigframes")
CASES = ["frame", "onstack", "nested", "autodisarm", "restore", "errors", "small"]
on_x86_64_linux = pytest.mark.skipif(platform.system() != "Linux" or platform.machine() != "x86_64",
                                     reason="compares with the host kernel")


def _both(*cases: str) -> tuple[bytes, bytes]:
    native = run_native([SIGFRAMES, *cases], env={}, no_aslr=True)
    emulated = run_emulated([SIGFRAMES, *cases], env={})
    assert native.status == emulated.status == 0
    return native.out, emulated.out


@on_x86_64_linux
@pytest.mark.parametrize("case", CASES)
def test_the_frame_and_the_alternate_stack_are_the_real_kernel_s(case: str) -> None:
    native, emulated = _both(case)
    assert native == emulated


@pytest.fixture
def model_frames(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The emulated kernel with the CPU model's own 576-byte XSAVE area, as if the host could not be measured."""
    hostframe.host_frame.cache_clear()
    monkeypatch.setattr(hostframe, "_sw_bytes_of_a_signal", _unmeasurable)
    try:
        assert hostframe.host_frame() == hostframe.MODEL
        yield
    finally:
        monkeypatch.undo()
        hostframe.host_frame.cache_clear()


def _unmeasurable() -> tuple[int, int, int, int]:
    raise OSError(errno.ENOSYS, "no signals here")


@on_x86_64_linux
@pytest.mark.skipif(hostframe.host_frame().size == hostframe.MODEL.size,
                    reason="this host's kernel saves x87 and SSE only: the two layouts are one")
def test_the_host_s_xsave_area_is_what_moves_the_frame(model_frames: None) -> None:
    """The negative control: with the model's area (576 bytes) in place of the host's, the frame moves."""
    native, emulated = _both("frame")
    assert b"xstate_size=576 " not in native
    assert native != emulated and b"xstate_size=576 " in emulated


@on_x86_64_linux
def test_the_measured_host_layout_is_the_one_native_frames_have() -> None:
    native, _ = _both("frame")
    measured = hostframe.host_frame()
    assert f"extended_size={measured.extended_size} xstate_size={measured.size} ".encode() in native
    assert f"minsigstksz: auxv={measured.minsigstksz} ".encode() in native


def test_do_sigaltstack() -> None:
    top = 0x10000 + 0x4000

    def ask(sp: int, flags: int, size: int, now: AltStack = DISABLED, rsp: int = 0x7FFF0000) -> AltStack:
        return changed(now, STACK_T.pack(sp, flags, 0, size), rsp)

    on = ask(0x10000, SS_ONSTACK, 0x4000)
    assert on == AltStack(0x10000, SS_ONSTACK, 0x4000) and on.mode(0x7FFF0000) == 0
    assert on.mode(top) == SS_ONSTACK and on.mode(0x10000) == 0  # (sp, sp + size]: the top is on it, sp is not
    assert ask(0x10000, SS_DISABLE, 0x4000) == AltStack(0, SS_DISABLE, 0)
    for flags, size, err in ((5, 0x4000, errno.EINVAL), (0, MINSIGSTKSZ - 1, errno.ENOMEM)):
        with pytest.raises(SyscallError) as caught:
            ask(0x10000, flags, size)
        assert caught.value.errno == err
    for same_or_not in (0x20000, 0x10000):  # on the stack, even asking for no change is EPERM
        with pytest.raises(SyscallError) as caught:
            ask(same_or_not, SS_ONSTACK, 0x4000, now=on, rsp=top - 64)
        assert caught.value.errno == errno.EPERM
    disarming = ask(0x10000, SS_AUTODISARM, 0x4000)
    assert not disarming.on(top - 64) and disarming.reported(top - 64) == STACK_T.pack(0x10000, SS_AUTODISARM, 0,
                                                                                       0x4000)
