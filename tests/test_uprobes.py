"""Uprobes under each design, on the bundled samples (spec sections cited per test)."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest
from conftest import attach_exe

from emu.designs import DESIGNS
from emu.errors import UsageError
from emu.guestio import GuestIO
from emu.kernel.uprobes.consumers import Consumer, Hit
from emu.machine import Machine, RunOptions, RunResult

SAMPLES = Path(__file__).resolve().parent.parent / "elf_samples"
REDZONE = str(SAMPLES / "redzone_probe")
TARGETS = str(SAMPLES / "probe_targets")
USDT = str(SAMPLES / "usdt_sample")
PROBE_TARGETS_OUTPUT = (
    "t_push=102 t_riprel=0x1122334455667788 t_callrax=42 t_jne=1,2 t_pushrsp=8 t_popf=1\n"
    "mc_add=42 mc_mul=12\ndone 3\n"
)


def machine(path: str, *args: str, design: str = "linux-6.18") -> tuple[Machine, GuestIO]:
    io = GuestIO.captured()
    return Machine(path, [path, *args], {}, RunOptions(design=design), io), io


def run(m: Machine) -> RunResult:
    return m.run()


def maps_line(m: Machine, addr: int) -> str:
    return next(line for line in m.mem.maps_text().splitlines() if int(line.split("-")[0], 16) == addr)


@pytest.mark.parametrize("design", list(DESIGNS))
def test_redzone_locals_survive_every_design_but_linux_618(design: str) -> None:
    m, io = machine(REDZONE, "5", design=design)
    m.attach("uprobe:rz_nop5_site")
    m.attach("usdt:redzone:site")
    if design == "nop10":
        m.attach("uprobe:rz_nop10_site")
    result = run(m)
    out = io.out.decode()
    if design == "linux-6.18":
        assert result.exit_status == 1
        mismatches = re.findall(r"MISMATCH (rz_\w+) i=(\d+)", out)
        # hit 1 goes through INT3 and clobbers nothing; every optimized hit after it does (spec 1.3)
        assert ("rz_nop5", "0") not in mismatches
        assert {("rz_nop5", str(i)) for i in range(1, 5)} <= set(mismatches)
        assert {("rz_usdt", str(i)) for i in range(1, 5)} <= set(mismatches)
    else:
        assert result.exit_status == 0, out
        assert out.rstrip().endswith("ok")


def test_linux_618_red_zone_words_are_exactly_the_trampoline_pushes() -> None:
    m, _ = machine(REDZONE, "3")
    seen: list[tuple[str, bytes, tuple[int, int, int, int]]] = []

    def handler(hit: Hit) -> None:
        r = hit.regs
        seen.append((hit.path.value, hit.read(r.sp - 32, 32), (r.ax, r.r11, r.cx, hit.address + 5)))

    m.attach("uprobe:rz_nop5_site", Consumer(handler=handler))
    run(m)
    assert [p for p, _, _ in seen] == ["int3", "call", "call"]
    first_words = struct.unpack("<4Q", seen[0][1])
    assert first_words != seen[0][2]  # INT3 path: the red zone still holds the locals
    for _, below, expected in seen[1:]:
        # rsp-32 = rax, rsp-24 = r11, rsp-16 = rcx, rsp-8 = site+5 (notes: Linux 6.18 key fact 1)
        assert struct.unpack("<4Q", below) == expected


def test_linux_618_site_bytes_trampoline_and_detach() -> None:
    m, io = machine(TARGETS)
    att = attach_exe(m, "uprobe:t_nop5")
    site = att.address
    assert m.mem.read(site, 5) == bytes.fromhex("cc1f440000")
    result = run(m)
    assert io.out.decode() == PROBE_TARGETS_OUTPUT and result.exit_status == 0
    code = m.mem.read(site, 5)
    assert code[0] == 0xE8
    target = site + 5 + struct.unpack("<i", code[1:])[0]
    assert maps_line(m, target).split()[1] == "r-xp"
    assert maps_line(m, target).endswith("[uprobes-trampoline]")
    assert m.mem.read(target, 19) == bytes.fromhex("5141535048c7c0500100000f0558415b59c3cc")
    assert att.summary()["hits"] == 3 and att.consumer.paths == {"int3": 1, "call": 2}
    assert result.exits == {"sysret": 2}
    att.detach()
    assert m.mem.read(site, 5) == bytes.fromhex("0f1f440000")
    assert "[uprobes-trampoline]" in maps_line(m, target)  # never unmapped (spec 3.4)


def test_jmp_slots_site_points_at_a_16_byte_slot() -> None:
    m, io = machine(TARGETS, design="jmp-slots")
    att = attach_exe(m, "uprobe:t_nop5")
    result = run(m)
    assert io.out.decode() == PROBE_TARGETS_OUTPUT
    code = m.mem.read(att.address, 5)
    assert code[0] == 0xE9
    slot = att.address + 5 + struct.unpack("<i", code[1:])[0]
    assert m.mem.read(slot, 16) == bytes.fromhex("488d64248051415350b8500100000f05")
    assert result.exits == {"iret": 2}
    att.detach()
    assert m.mem.read(att.address, 5) == bytes.fromhex("0f1f440000")


def test_nop10_optimizes_to_lea_call_and_detaches_to_jmp8() -> None:
    m, io = machine(TARGETS, design="nop10")
    att = attach_exe(m, "uprobe:t_nop10")
    run(m)
    assert io.out.decode() == PROBE_TARGETS_OUTPUT
    code = m.mem.read(att.address, 10)
    assert code[:6] == bytes.fromhex("488d642480e8")
    target = att.address + 10 + struct.unpack("<i", code[6:])[0]
    assert m.mem.read(target + 0x11, 3) == bytes.fromhex("c28000")  # ret $0x80
    att.detach()
    assert m.mem.read(att.address, 2) == bytes.fromhex("eb08")


OPTIMIZED = ["f_nop5", "f_nop5_disp08", "f_nop5_66", "f_nop5_pfx90", "f_nop5_rexw", "f_nop5_pgend"]
NOT_OPTIMIZED = ["f_nop1", "f_nop2", "f_nop3", "f_nop4", "f_nop6", "f_nop7", "f_nop8", "f_nopl5_reg1",
                 "f_jmp0_5", "f_lea0_5", "f_nop5_xpage"]


def test_which_nop_forms_linux_618_optimizes() -> None:
    """docs/linux-6.18-observed.md section 8a, encoding by encoding."""
    m, io = machine(TARGETS)
    atts = {name: m.attach(f"uprobe:{name}") for name in OPTIMIZED + NOT_OPTIMIZED}
    result = run(m)
    assert result.exit_status == 0 and io.out.decode() == PROBE_TARGETS_OUTPUT
    assert {n for n, a in atts.items() if a.summary()["optimized"]} == set(OPTIMIZED)
    for name, att in atts.items():
        assert att.summary()["hits"] == 3, name
    with pytest.raises(UsageError, match="ENOTSUPP"):
        m.attach("uprobe:f_nop5_3e")


@pytest.mark.parametrize("design", list(DESIGNS))
@pytest.mark.parametrize("symbol", ["t_ret", "t_riprel", "t_callrax", "t_jne", "t_pushrsp", "t_popf_site", "t_push"])
def test_int3_path_emulates_or_steps_without_changing_the_program(design: str, symbol: str) -> None:
    m, io = machine(TARGETS, design=design)
    att = m.attach(f"uprobe:{symbol}")
    result = run(m)
    assert (result.exit_status, io.out.decode()) == (0, PROBE_TARGETS_OUTPUT)
    expected_hits = 6 if symbol == "t_jne" else 3  # t_jne runs twice per iteration
    assert att.summary()["hits"] == expected_hits
    assert att.consumer.paths == {"int3": expected_hits}


@pytest.mark.parametrize("design", list(DESIGNS))
@pytest.mark.parametrize("symbol", ["t_nop5", "t_ret", "t_push", "mc_add"])
def test_uretprobe_fires_once_per_return(design: str, symbol: str) -> None:
    returns: list[int] = []
    m, io = machine(TARGETS, design=design)
    att = m.attach(f"uretprobe:{symbol}", Consumer(ret_handler=lambda hit: returns.append(hit.regs.ax)))
    result = run(m)
    assert (result.exit_status, io.out.decode()) == (0, PROBE_TARGETS_OUTPUT)
    assert len(returns) == 3 and att.summary()["hits"] == 3
    if symbol == "t_push":
        assert returns == [100, 101, 102]


def test_consumer_redirecting_ip_skips_the_instruction() -> None:
    m, io = machine(TARGETS, design="linux-6.18")
    # t_push returns a+b; send every call straight to its `ret`: rax keeps whatever it held.
    ret_addr = m.resolver.symbols["t_ret"][0]

    def redirect(hit: Hit) -> None:
        hit.regs.ip = ret_addr

    m.attach("uprobe:t_push", Consumer(handler=redirect))
    result = run(m)
    assert result.exit_status == 1 and "BAD" in io.out.decode()


def test_usdt_semaphore_counts_while_attached_and_args_decode() -> None:
    m, io = machine(USDT, design="linux-6.18")
    values: list[list[int]] = []
    att = attach_exe(m, "usdt:demo:sema")
    note = att.resolved.usdt
    assert note is not None and att.resolved.semaphore is not None
    assert struct.unpack("<H", m.mem.read(att.resolved.semaphore, 2))[0] == 1
    att.consumer.handler = lambda hit: values.append([a.read(hit.regs, hit.read) for a in note.args])
    result = run(m)
    assert result.exit_status == 0
    assert "sema_hits=3" in io.out.decode()
    assert len(values) == 3 and all(len(v) == 2 for v in values)
    att.detach()
    assert struct.unpack("<H", m.mem.read(att.resolved.semaphore, 2))[0] == 0


def test_usdt_nop_combo_moves_to_the_long_nop_only_when_optimizable() -> None:
    for design, expect_shift in (("linux-6.18", True), ("int3", False), ("nop10", False)):
        m, _ = machine(USDT, design=design)
        att = attach_exe(m, "usdt:demo:combo5")
        assert (att.address == att.resolved.address + 1) is expect_shift, design
    m, _ = machine(USDT, design="nop10")
    att = attach_exe(m, "usdt:demo:combo10")
    assert att.address == att.resolved.address + 1


def test_refusals_say_what_is_wrong() -> None:
    m, _ = machine(TARGETS)
    with pytest.raises(UsageError, match="did you mean"):
        m.attach("uprobe:t_nop55")
    with pytest.raises(UsageError, match="instruction boundary"):
        m.attach("uprobe:t_riprel+1")
    with pytest.raises(UsageError, match="not in an executable mapping"):
        m.attach("uprobe:0x10")
    with pytest.raises(UsageError, match="no USDT probe"):
        m.attach("usdt:demo:nope")


@pytest.mark.parametrize("design", ["linux-6.18", "jmp-slots", "nop10", "int3"])
def test_consumer_moving_sp_takes_the_iret_path(design: str) -> None:
    """A consumer that returns from the probed function itself (ip = [sp], sp += 8): spec 2.1 step 8."""
    m, io = machine(TARGETS, design=design)

    def early_return(hit: Hit) -> None:
        hit.regs.ip = struct.unpack("<Q", hit.read(hit.regs.sp, 8))[0]
        hit.regs.sp += 8

    site = "uprobe:t_nop10" if design == "nop10" else "uprobe:t_nop5"
    att = m.attach(site, Consumer(handler=early_return))
    result = run(m)
    assert (result.exit_status, io.out.decode()) == (0, PROBE_TARGETS_OUTPUT)
    assert att.summary()["hits"] == 3
    if design == "int3":
        assert result.exits == {}
    else:  # hits 2 and 3 come through the syscall; a moved sp always leaves by IRET
        assert result.exits == {"iret": 2}


def test_cli_detach_after_n_hits_unoptimizes_mid_run(capfd: pytest.CaptureFixture[str]) -> None:
    from emu import cli

    status = cli.main(["run", "--clear-env", "--kernel", "linux-6.18", "--detach-after", "2",
                       "-p", "uprobe:rz_nop5_site", REDZONE, "5"])
    out, err = capfd.readouterr()
    assert status == 1 and out.count("MISMATCH rz_nop5") == 1  # only the one optimized hit clobbered
    row = next(line for line in err.splitlines() if line.startswith("uprobe:rz_nop5_site"))
    assert row.split()[2:] == ["2", "call:1,int3:1", "no"]  # removed after hit 2: the nop5 is back
