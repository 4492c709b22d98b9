"""elf_samples/linux_facts probes itself through perf_event_open and prints what it sees of the
kernel (docs/linux-6.18-observed.md sections 4, 8 and 10). Emulated under linux-6.18 it must
print what the real kernel makes it print; the native half runs with ASLR off (personality
ADDR_NO_RANDOMIZE, as `setarch -R`) and is skipped without root and the uprobe PMU.

The emulated half of each group also checks its lines against the rule they follow, so the
rules are tested on machines without the PMU too.
"""

from __future__ import annotations

import ctypes
import re
import subprocess
from pathlib import Path

import pytest
from conftest import GuestKernel

from emu import cpu as cpu_module
from emu.abi import Prot
from emu.cpu import user_flags
from emu.guestio import GuestIO
from emu.machine import Machine, RunOptions
from emu.native import available as native_available

FACTS = str(Path(__file__).resolve().parent.parent / "elf_samples" / "linux_facts")
ADDR_NO_RANDOMIZE = 0x0040000

needs_native = pytest.mark.skipif(not native_available("6.18"), reason="needs root, Linux 6.18 and the uprobe PMU")


def _no_aslr() -> None:
    ctypes.CDLL(None).personality(ADDR_NO_RANDOMIZE)


def native(command: str) -> tuple[str, int]:
    done = subprocess.run([FACTS, command], capture_output=True, env={}, timeout=60, preexec_fn=_no_aslr)
    return done.stdout.decode(), done.returncode


def emulated(command: str, design: str = "linux-6.18") -> tuple[str, int]:
    io = GuestIO.captured()
    result = Machine(FACTS, [FACTS, command], {}, RunOptions(design=design), io).run()
    return bytes(io.out).decode(), result.exit_status


# ------------------------------------------------------------------------------- section 10: rflags
_FLAGS_LINE = re.compile(r"in=(0x[0-9a-f]+)|out=(0x[0-9a-f]+)|r11=(0x[0-9a-f]+)|consumer=(0x[0-9a-f]+)|handler=(0x[0-9a-f]+)")


def flags_disagreements(text: str) -> list[str]:
    """Lines whose read-back flags (pushf, r11 after a syscall, the consumer's sample, the signal
    frame) are not the popf'd value as user mode can hold it."""
    bad = []
    for line in text.splitlines():
        values = {k: v for m in _FLAGS_LINE.finditer(line) for k, v in zip(("in", "out", "r11", "consumer", "handler"),
                                                                             m.groups(), strict=True) if v}
        if "in" not in values:
            continue
        want = user_flags(int(values.pop("in"), 16))
        if any(int(v, 16) != want for v in values.values()):
            bad.append(line)
    return bad


def test_user_flags_keeps_if_and_bit1_and_drops_iopl() -> None:
    assert user_flags(0xCD7) == 0xED7 and user_flags(0x3ED7) == 0xED7 and user_flags(0) == 0x202
    assert user_flags(0x200ED7) == 0x200ED7  # ID stays the program's


def test_popf_and_every_exit_path_keep_if_emulated() -> None:
    out, status = emulated("rflags")
    assert status == 0
    assert len(out.splitlines()) == 5 * 6 + 3  # bare, 3 sites, syscall, signal: 5 values each; 3 counts
    assert flags_disagreements(out) == []


def test_the_flags_check_catches_a_cpu_left_at_cpl0(monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: at CPL 0 (Unicorn's start) popf clears IF and sets IOPL."""
    monkeypatch.setattr(cpu_module.Cpu, "_enter_user_mode", lambda self: None)
    out, _ = emulated("rflags")
    assert any(line.startswith("bare in=0xcd7 out=0xcd7") for line in flags_disagreements(out))


def test_kernel_written_flags_keep_if() -> None:
    """A value the fake kernel writes for user mode (sigreturn, a consumer's regs) gets IF back."""
    c = cpu_module.Cpu()
    c.write(cpu_module.Reg.RFLAGS, 0x3CD7)
    assert c.read(cpu_module.Reg.RFLAGS) == 0xED7
    state = c.read_user_state()
    state[17] = 0x2
    c.write_user_state(state, write_rip=False)
    assert c.read(cpu_module.Reg.RFLAGS) == 0x202


@needs_native
def test_rflags_natively_and_emulated() -> None:
    assert native("rflags") == emulated("rflags")


# -------------------------------------------------------------------- section 4: 462 is mseal
PAGE = 4096
EINVAL, ENOMEM, EPERM, EACCES, EFAULT, EIO, ENOSYS = 22, 12, 1, 13, 14, 5, 38


def _anon(guest: GuestKernel, pages: int) -> int:
    addr = guest("mmap", 0, pages * PAGE, 3, 0x22, 0xFFFFFFFF, 0)
    assert addr > 0
    return addr


def test_mseal_checks_its_arguments(guest: GuestKernel) -> None:
    a = _anon(guest, 4)
    assert guest(462, a + 1, PAGE, 0) == -EINVAL
    assert guest(462, a, PAGE, 1) == -EINVAL
    assert guest(462, a, -PAGE & 0xFFFFFFFFFFFFFFFF, 0) == -EINVAL  # the range wraps
    assert guest("munmap", a + 2 * PAGE, PAGE) == 0
    assert guest(462, a, 4 * PAGE, 0) == -ENOMEM  # a hole
    assert guest(462, a, 0, 0) == 0
    assert not any(v.sealed for v in guest.mem)  # nothing sealed by the failed or empty calls


def test_a_sealed_mapping_refuses_to_change(guest: GuestKernel) -> None:
    a = _anon(guest, 2)
    assert guest(462, a, 1, 0) == 0  # the length is rounded up to the page
    assert guest("munmap", a, PAGE) == -EPERM
    assert guest("munmap", a, 2 * PAGE) == -EPERM  # nothing is unmapped, not even the unsealed page
    assert guest("mprotect", a, PAGE, 1) == -EPERM
    assert guest("mremap", a, PAGE, 2 * PAGE, 1, 0) == -EPERM
    assert guest("mmap", a, PAGE, 1, 0x32, 0xFFFFFFFF, 0) == -EPERM  # MAP_FIXED over it
    assert guest("munmap", a + PAGE, PAGE) == 0  # its unsealed neighbour still can


def test_an_unsealed_mapping_still_changes(guest: GuestKernel) -> None:
    """Negative control for the EPERM checks: the same calls succeed without the seal."""
    a = _anon(guest, 2)
    assert guest("mprotect", a, PAGE, 1) == 0
    assert guest("munmap", a, 2 * PAGE) == 0


def test_462_is_the_uretprobe_syscall_only_in_uretprobe_rfc() -> None:
    for design, row in (("linux-6.18", "mseal"), ("jmp-slots", "mseal"), ("nop10", "mseal"),
                        ("uretprobe-rfc", "uretprobe")):
        m = Machine(FACTS, [FACTS], {}, RunOptions(design=design), GuestIO.captured())
        assert m.kernel.table[462].name == row, design


def test_mseal_emulated() -> None:
    out, status = emulated("mseal")
    lines = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
    assert status == 0 and lines["seal"] == "ret=0 errno=0" and lines["munmap_sealed"] == "ret=-1 errno=EPERM"
    assert "still_writable=1" in out


@needs_native
def test_mseal_natively_and_emulated() -> None:
    assert native("mseal") == emulated("mseal")


# ------------------------------------------- section 8: trampoline VMA operations, /proc/self/mem
def test_special_mapping_operations_emulated() -> None:
    out, status = emulated("tramp")
    lines = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
    assert status == 0
    assert lines["tramp_mremap_grow"].endswith("EFAULT") and lines["tramp_mremap_move"].endswith("EPERM")
    assert lines["tramp_mprotect_rw"].endswith("EACCES") and lines["tramp_mprotect_rx"] == "ret=0 errno=0"
    assert lines["mem_read_xol"].endswith("EIO") and lines["mem_read_data"] == "ret=16 errno=0"
    assert "tramp_left=0" in out and "mem_data_now=DATA in .data" in out
    assert lines["hit_after_munmap"].startswith("byte0 e8 -> e8 count+=0 signal=SIGSEGV rip=tramp+0")
    assert lines["new_site_hit1"].startswith("byte0 cc -> e8 count+=1 signal=none")  # the stale page, reused


def test_proc_self_mem_reads_writes_and_refuses(guest: GuestKernel) -> None:
    fd = guest.open("/proc/self/mem", 2)
    assert fd >= 0
    data = guest.alloc(16, b"0123456789abcdef")
    buf = guest.alloc(16)
    assert guest("pread64", fd, buf, 16, data) == 16 and guest.read(buf, 16) == b"0123456789abcdef"
    assert guest("pwrite64", fd, guest.cstr("XY"), 2, data) == 2 and guest.read(data, 2) == b"XY"
    text = guest.machine.exe.entry
    assert guest("pwrite64", fd, guest.cstr(b"\xcc"), 1, text) == 1 and guest.read(text, 1) == b"\xcc"  # FOLL_FORCE
    assert guest("pread64", fd, buf, 16, PAGE) == -EIO  # unmapped
    assert guest("lseek", fd, data, 0) == data and guest("read", fd, buf, 2) == 2 and guest.read(buf, 2) == b"XY"
    assert guest("lseek", fd, 0, 2) == -EINVAL  # SEEK_END
    xol = guest.machine.uprobes.get_xol_area()
    assert guest("pread64", fd, buf, 16, xol.vaddr) == -EIO  # [uprobes]: no pages behind it


def test_special_mappings_cannot_grow_or_gain_rights(guest: GuestKernel) -> None:
    xol = guest.machine.uprobes.get_xol_area().vaddr
    assert guest("mprotect", xol, PAGE, 3) == -EACCES
    assert guest("mremap", xol, PAGE, 2 * PAGE, 1, 0) == -EFAULT
    plain = _anon(guest, 1)
    assert guest("mremap", plain, PAGE, 2 * PAGE, 1, 0) > 0  # negative control: an ordinary mapping grows


@needs_native
def test_trampoline_operations_natively_and_emulated() -> None:
    assert native("tramp") == emulated("tramp")


# ------------------------------------------------------- section 8: fork, per-process filtering
def _fork_lines(text: str, inherit: int) -> list[str]:
    """The lines of one half of `linux_facts fork`. With inherit, only what the child sees: what
    the parent reads back afterwards is racy on the real kernel (the child's inherited count is
    summed, or not, and the parent's event sometimes stops counting)."""
    lines = text.split(f"inherit={inherit} parent before fork")[1].split("inherit=1 parent before fork")[0]
    out = [line for line in lines.splitlines()[1:] if line.startswith("child hit")]
    if not inherit:
        out += [line for line in lines.splitlines() if line.startswith("inherit=0")]
    return out


def test_a_child_no_consumer_wants_loses_the_breakpoint_emulated() -> None:
    out, status = emulated("fork")
    assert status == 0
    child = [line for line in out.splitlines() if line.startswith("child hit")]
    # pid 0, no inherit: the child's first hit restores the nop5 in the child, is not counted
    assert child[:3] == ["child hit1: cc1f440000 -> 0f1f440000", "child hit2: 0f1f440000 -> 0f1f440000",
                         "child hit3: 0f1f440000 -> 0f1f440000"]
    assert "inherit=0 child exit=0 parent after: byte0=cc count=0" in out  # the parent keeps its INT3
    assert child[3].startswith("child hit1: cc1f440000 -> e8")  # inherit: the child's own event optimizes


def test_a_probe_attached_from_outside_counts_every_process() -> None:
    """-p / Machine.attach: no filter, so the child's hits count and its breakpoint stays."""
    io = GuestIO.captured()
    m = Machine(FACTS, [FACTS, "fork"], {}, RunOptions(design="linux-6.18"), io)
    att = m.attach("uprobe:site_fork")
    m.run()
    assert "child hit1: cc1f440000 -> e8" in bytes(io.out).decode()  # the first child optimizes its copy
    assert att.consumer.hits > 2  # the parent hits its site twice; the rest are the first child's


@needs_native
def test_fork_filtering_natively_and_emulated() -> None:
    (nout, nstatus), (eout, estatus) = native("fork"), emulated("fork")
    assert (nstatus, _fork_lines(nout, 0), _fork_lines(nout, 1)) == (estatus, _fork_lines(eout, 0), _fork_lines(eout, 1))


# ------------------------------------------------------ section 9: the address space, ASLR off
CAT = "/usr/bin/cat"


def _native_argv(argv: list[str]) -> str:
    done = subprocess.run(argv, capture_output=True, env={}, timeout=60, preexec_fn=_no_aslr)
    return done.stdout.decode()


def _emulated_argv(argv: list[str]) -> tuple[str, Machine]:
    io = GuestIO.captured()
    m = Machine(argv[0], argv, {}, RunOptions(design="linux-6.18"), io)
    m.run()
    return bytes(io.out).decode(), m


def _maps_of(text: str) -> list[tuple[int, int, str, str]]:
    out = []
    for line in text.splitlines():
        fields = line.split()
        lo, hi = (int(x, 16) for x in fields[0].split("-"))
        out.append((lo, hi, fields[1], fields[5] if len(fields) > 5 else ""))
    return out


def test_layout_rules_emulated() -> None:
    """[stack] 132 KiB, [vvar] 4 + [vvar_vclock] 2 + [vdso] 2 pages right below ld.so, [vsyscall] last."""
    text, m = _emulated_argv([CAT, "/proc/self/maps"])
    maps = _maps_of(text)
    names = [name for *_, name in maps]
    i = names.index("[vvar]")
    (v0, v1, _, _), (c0, c1, _, _), (d0, d1, dperm, _), (ld0, *_rest) = maps[i:i + 4]
    assert (v1 - v0, c1 - c0, d1 - d0) == (0x4000, 0x2000, 0x2000) and v1 == c0 and c1 == d0 and d1 == ld0
    assert names[i + 1:i + 3] == ["[vvar_vclock]", "[vdso]"] and dperm == "r-xp" and "ld-linux" in names[i + 3]
    stack = maps[names.index("[stack]")]
    assert (stack[0], stack[1]) == (0x7FFFFFFDE000, 0x7FFFFFFFF000)
    assert maps[-1] == (0xFFFFFFFFFF600000, 0xFFFFFFFFFF601000, "--xp", "[vsyscall]")
    assert dict(m.kernel.ident.auxv)[33] == d0  # AT_SYSINFO_EHDR


def test_auxv_order_as_linux_writes_it(guest: GuestKernel) -> None:
    keys = [key for key, _ in guest.kernel.ident.auxv]
    assert keys == [33, 51, 16, 6, 17, 3, 4, 5, 7, 8, 9, 11, 12, 13, 14, 23, 25, 26, 31, 15, 27, 28, 0]


def test_the_vdso_serves_the_time_without_system_calls() -> None:
    io = GuestIO.captured()
    m = Machine(FACTS, [FACTS, "clock"], {}, RunOptions(design="linux-6.18"), io)
    result = m.run()
    out = bytes(io.out).decode()
    flags = dict(line.split("=", 1) for line in out.replace(" ", "\n").splitlines())
    assert result.exit_status == 0 and flags.pop("bad_clock") == "EINVAL" and flags.pop("res_monotonic") == "0.000000001"
    assert set(flags.values()) == {"1"}, out
    # only the clocks the vDSO leaves to the kernel (CPU time, a bad id) were system calls
    assert result.syscalls.get("clock_gettime") == 2 and "gettimeofday" not in result.syscalls
    assert "time" not in result.syscalls and "getcpu" not in result.syscalls


def test_the_stack_grows_down_to_the_rlimit_emulated() -> None:
    out, status = emulated("stack")
    lines = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
    assert status == 0 and lines["past the rlimit"] == "SIGSEGV"
    assert lines["after 1 MiB"].startswith("7fffffefe000-7ffffffff000")
    assert lines["end"].startswith("7fffff7ff000-7ffffffff000")  # exactly RLIMIT_STACK


def test_the_stack_does_not_grow_into_the_guard_gap(guest: GuestKernel) -> None:
    stack = next(v for v in guest.mem if v.name == "[stack]")
    below = stack.start - 0x10000
    guest.mem.map(below - PAGE, PAGE, Prot.READ | Prot.WRITE)  # a mapping 64 KiB below the stack: inside the 1 MiB gap
    assert not guest.mem.grow_stack(stack.start - PAGE)
    guest.mem.unmap(below - PAGE, PAGE)
    assert guest.mem.grow_stack(stack.start - PAGE)  # negative control: without it the stack grows


@needs_native
@pytest.mark.parametrize("argv", [[FACTS, "maps"], [FACTS + "_pie", "maps"], [CAT, "/proc/self/maps"]],
                         ids=["static", "static-pie", "dynamic"])
def test_proc_self_maps_equals_the_real_kernels_with_aslr_off(argv: list[str]) -> None:
    assert _native_argv(argv) == _emulated_argv(argv)[0]


@needs_native
def test_stack_growth_natively_and_emulated() -> None:
    assert native("stack") == emulated("stack")


@needs_native
def test_vdso_functions_natively_and_emulated() -> None:
    assert native("clock") == emulated("clock")


@needs_native
def test_auxv_natively_and_emulated() -> None:
    """LD_SHOW_AUXV of /bin/true, every entry and value; the CPU's HWCAP words, platform and minimal
    signal stack (it follows the XSAVE size: the emulated CPU has no AVX state) come from the CPU
    model (emu/cpumodel.py), compared there, so only their presence is compared here."""
    env = {"LD_SHOW_AUXV": "1"}
    native_out = subprocess.run(["/bin/true"], capture_output=True, env=env, timeout=60, preexec_fn=_no_aslr).stdout
    io = GuestIO.captured()
    Machine("/bin/true", ["/bin/true"], env, RunOptions(design="linux-6.18"), io).run()

    def entries(text: bytes) -> list[tuple[str, str]]:
        rows = [tuple(part.strip() for part in line.split(":", 1)) for line in text.decode().splitlines()]
        return [(k, "-" if k in ("AT_HWCAP", "AT_HWCAP2", "AT_PLATFORM", "AT_MINSIGSTKSZ") else v) for k, v in rows]

    assert entries(native_out) == entries(bytes(io.out))


# ------------------------------------------------------------- diff compares like with like
def test_diff_reports_a_maps_difference() -> None:
    """Negative control for the maps comparison: one moved line is the first difference."""
    from emu.diff import DiffReport
    from emu.native import NativeRun

    maps = "00400000-00401000 r--p 00000000 fe:00 1 /x\n7ffffffde000-7ffffffff000 rw-p 00000000 00:00 0 [stack]\n"
    native_run = NativeRun(b"", b"", 0, (), (), maps)
    assert DiffReport(native_run, b"", b"", 0, (), (), (), maps).first_difference() is None
    moved = maps.replace("7ffffffde000", "7fffff7ff000")
    difference = DiffReport(native_run, b"", b"", 0, (), (), (), moved).first_difference()
    assert difference is not None and difference.startswith("/proc/self/maps at exit line 2")


@needs_native
def test_diff_compares_addresses_exactly() -> None:
    from emu.diff import run_diff

    redzone = str(Path(FACTS).parent / "redzone_probe")
    report = run_diff(redzone, [redzone, "5"], ["uprobe:rz_nop5_site"], {})
    assert report.first_difference() is None
    assert "[uprobes-trampoline]" in report.native.maps and report.native.maps == report.maps
    assert report.native.site_bytes == report.sites and report.sites[0][:1] == b"\xe8"


# --------------------------------------------------------------------- --aslr SEED
def _aslr_maps(seed: int | None, argv: list[str] | None = None) -> list[tuple[int, int, str, str]]:
    argv = argv or [CAT, "/proc/self/maps"]
    io = GuestIO.captured()
    Machine(argv[0], argv, {}, RunOptions(design="linux-6.18", aslr=seed), io).run()
    return _maps_of(bytes(io.out).decode())


def test_aslr_is_deterministic_per_seed_and_off_by_default() -> None:
    assert _aslr_maps(5) == _aslr_maps(5)
    assert _aslr_maps(5) != _aslr_maps(6)
    assert _aslr_maps(None)[0][0] == 0x555555554000  # negative control: no seed, Linux's ASLR-off layout


def test_aslr_randomizes_within_linuxs_ranges() -> None:
    from emu.abi import STACK_TOP

    for seed in range(4):
        maps = _aslr_maps(seed)
        exe = [m for m in maps if m[3] == CAT]
        heap = next(m for m in maps if m[3] == "[heap]")
        stack = next(m for m in maps if m[3] == "[stack]")
        vdso = next(m for m in maps if m[3] == "[vdso]")
        assert 0x555555554000 <= exe[0][0] < 0x555555554000 + (1 << 40)  # 28 bits of pages
        assert exe[-1][1] + 0x1000 <= heap[0] < exe[-1][1] + 0x1000 + (1 << 30)  # up to 1 GiB above the bss
        assert STACK_TOP - (1 << 34) < stack[1] <= STACK_TOP and stack[1] - stack[0] == 0x21000
        assert vdso[1] < stack[0] - (1 << 34)  # below mmap_base, itself below the stack's 16 GiB of range


def test_aslr_stack_tables_move_by_up_to_8_kib() -> None:
    from emu.process import layout

    pads = {layout.randomized(seed).align_pad for seed in range(20)}
    assert len(pads) > 10 and all(0 <= p < 8192 for p in pads)


def test_a_bad_aslr_seed_is_a_one_line_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    from emu import cli

    assert cli.main(["run", "--aslr", "nope", FACTS, "mseal"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--aslr" in err[0]


def _native_aslr(command: str) -> tuple[str, int]:
    done = subprocess.run([FACTS, command], capture_output=True, env={}, timeout=60)
    return done.stdout.decode(), done.returncode


def _emulated_aslr(command: str, seed: int) -> tuple[str, int]:
    io = GuestIO.captured()
    result = Machine(FACTS, [FACTS, command], {}, RunOptions(design="linux-6.18", aslr=seed), io).run()
    return bytes(io.out).decode(), result.exit_status


@needs_native
@pytest.mark.parametrize("command", ["rflags", "mseal", "tramp", "clock"])
def test_facts_that_are_not_addresses_agree_with_a_native_aslr_run(command: str) -> None:
    assert _native_aslr(command) == _emulated_aslr(command, seed=11)


# ----------------------------------------------------- section 8: stack at the edge of mapped memory
def test_the_optimized_path_needs_32_bytes_below_rsp_emulated() -> None:
    out, status = emulated("edge")
    lines = dict(line.split(": ", 1) for line in out.splitlines())
    assert status == 0 and lines["hit1_int3_rsp_at_edge"] == "path=int3 count+=1 signal=none"
    assert lines["hit2_call_rsp_at_edge"] == "path=call count+=0 signal=SIGSEGV addr=rsp-8 rip=site+0"
    assert lines["call_rsp_edge_plus24"] == "path=call count+=0 signal=SIGSEGV addr=rsp-32 rip=tramp+3"
    assert lines["call_rsp_edge_plus32"] == "path=call count+=1 signal=none"


@needs_native
def test_stack_edge_natively_and_emulated() -> None:
    assert native("edge") == emulated("edge")


def test_a_forked_child_never_reads_an_earlier_time() -> None:
    """The child's [vvar] is a copy: attaching it folds the parent's vDSO readings in first."""
    code = "import os,time; t=time.monotonic(); pid=os.fork(); print(time.monotonic() > t); pid and os.wait()"
    python = "/usr/bin/python3.11"
    if not Path(python).exists():
        pytest.skip(f"{python} absent")
    io = GuestIO.captured()
    Machine(python, [python, "-c", code], {}, RunOptions(design="linux-6.18"), io).run()
    assert bytes(io.out).split() == [b"True", b"True"]


# ------------------------------------------- sections 6 and 9: placement depends on the heap gap
DYN = FACTS + "_dyn"


def _place(seed: int | None) -> str:
    io = GuestIO.captured()
    Machine(DYN, [DYN, "place"], {}, RunOptions(design="linux-6.18", aslr=seed), io).run()
    return bytes(io.out).decode()


def test_the_last_sites_trampoline_goes_above_the_binary_only_with_the_heap_gap() -> None:
    assert _place(None) == "optimized=yes tramp=below count=2\n"  # the heap is adjacent: the page below is nearest
    assert {_place(seed) for seed in (1, 2, 3)} == {"optimized=yes tramp=above count=2\n"}


@needs_native
def test_trampoline_placement_natively_with_and_without_aslr() -> None:
    aslr_off = _native_argv([DYN, "place"])
    aslr_on = subprocess.run([DYN, "place"], capture_output=True, env={}, timeout=60).stdout.decode()
    assert (aslr_off, aslr_on) == (_place(None), _place(4))
