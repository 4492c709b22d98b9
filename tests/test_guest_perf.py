"""Guest-side perf_event_open on the uprobe PMU: a program that probes itself runs as natively."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import symbol_file_offset

from emu.designs import DESIGNS
from emu.guestio import GuestIO
from emu.kernel.dispatch import KernelConfig
from emu.kernel.fs.open_ import open_path
from emu.kernel.uprobes.consumers import Consumer
from emu.machine import Machine, RunOptions
from emu.native import available as native_available

SELFPROBE = str(Path(__file__).resolve().parent.parent / "elf_samples" / "selfprobe")
EXPECTED = (
    b"pmu type found: yes\n"
    b"enabled: counter=5 ret=7\n"  # 2 calls while disabled are not counted; the uretprobe counts all 7
    b"disabled: counter=5\n"  # DISABLE: the probe stays, the hit is not counted
    b"reset+enabled: counter=1 ret=9\n"
    b"samples=9 ip_ok=9 regs_ok=9\n"  # one PERF_RECORD_SAMPLE per hit, ip and regs of the probed insn
    b"sum=115\n"
)


@pytest.mark.parametrize("design", list(DESIGNS))
def test_self_probing_program_under_emulation(design: str) -> None:
    io = GuestIO.captured()
    m = Machine(SELFPROBE, [SELFPROBE], {}, RunOptions(design=design), io)
    result = m.run()
    assert (result.exit_status, bytes(io.out), bytes(io.err)) == (0, EXPECTED, b"")
    target = m.resolver.symbols["target"][0]
    assert m.mem.read(target, 1) != b"\xcc"  # close() detached every probe
    assert m.uprobes.probes == {}


@pytest.mark.skipif(not native_available(), reason="needs root and the uprobe PMU")
def test_same_output_natively() -> None:
    native = subprocess.run([SELFPROBE], capture_output=True, env={}, timeout=60)
    assert (native.returncode, native.stdout) == (0, EXPECTED)


def test_sysfs_pmu_files_are_served_under_any_root(tmp_path: Path) -> None:
    m = Machine(SELFPROBE, [SELFPROBE], {}, RunOptions(kernel=KernelConfig(rootfs=str(tmp_path))), GuestIO.captured())
    k = m.kernel
    for path, content in (("/sys/bus/event_source/devices/uprobe/type", b"8\n"),
                          ("/sys/bus/event_source/devices/uprobe/format/retprobe", b"config:0\n"),
                          ("/sys/bus/event_source/devices/uprobe/format/ref_ctr_offset", b"config:32-63\n")):
        assert open_path(k, -100 & 0xFFFFFFFF, path, 0).read(100) == content


ENCODINGS_618 = (
    b"nop5         hits=2 byte0=e8 call->trampoline=yes tramp-exe=-4096 detached=0f\n"
    b"nop5_disp08  hits=2 byte0=e8 call->trampoline=yes tramp-exe=-4096 detached=0f\n"
    b"nop5_66      hits=2 byte0=e8 call->trampoline=yes tramp-exe=-4096 detached=66\n"
    b"nop5_pfx90   hits=2 byte0=e8 call->trampoline=yes tramp-exe=-4096 detached=66\n"
    b"nopl5_reg1   hits=2 byte0=cc detached=0f\n"
    b"lea0_5       hits=2 byte0=cc detached=48\n"
    b"nop1         hits=2 byte0=cc detached=90\n"
)


def test_encodings_and_trampoline_placement_as_on_linux_618() -> None:
    """Which 5-byte forms get the call, that it targets the start of an r-xp [uprobes-trampoline]
    mapping on the page just below the executable, and that detach restores byte 0 (notes 4, 6, 8a)."""
    io = GuestIO.captured()
    result = Machine(SELFPROBE, [SELFPROBE, "encodings"], {}, RunOptions(design="linux-6.18"), io).run()
    assert (result.exit_status, bytes(io.out)) == (0, ENCODINGS_618)


@pytest.mark.skipif(not native_available(), reason="needs root and the uprobe PMU")
def test_encodings_natively() -> None:
    native = subprocess.run([SELFPROBE, "encodings"], capture_output=True, env={}, timeout=60)
    assert (native.returncode, native.stdout) == (0, ENCODINGS_618)


def test_perf_attach_to_a_mapped_library() -> None:
    """config1 may name any file mapped in the process: here the interpreter, mapped at exec."""
    hello = str(Path(SELFPROBE).parent / "hello_dynamic")
    ld = "/lib64/ld-linux-x86-64.so.2"
    if not os.path.exists(ld):
        pytest.skip(f"{ld} absent")
    offset = symbol_file_offset(ld, "_dl_debug_state")
    m = Machine(hello, [hello], {}, RunOptions(), GuestIO.captured())
    consumer = Consumer()
    assert m.kernel.perf_attach is not None
    detach = m.kernel.perf_attach(ld, offset, False, 0, consumer)
    assert m.run().exit_status == 0 and consumer.hits == 2  # r_debug's breakpoint: before and after loading libc
    detach()


def test_perf_attach_to_a_library_mapped_later() -> None:
    """Like the kernel's inode-based uprobes: a library not mapped yet gets the probe when ld.so maps it."""
    libc = "/lib/x86_64-linux-gnu/libc.so.6"
    if not os.path.exists(libc):
        pytest.skip(f"{libc} absent")
    hello = str(Path(SELFPROBE).parent / "hello_dynamic")
    offset = symbol_file_offset(libc, "fwrite")
    m = Machine(hello, [hello], {}, RunOptions(), GuestIO.captured())
    consumer = Consumer()
    assert m.kernel.perf_attach is not None
    m.kernel.perf_attach(libc, offset, False, 0, consumer)
    assert m.run().exit_status == 0 and consumer.hits == 1
