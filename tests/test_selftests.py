"""The kernel selftest prog_tests/uprobe_syscall.c (spec section 6), ported.

The user-space side is elf_samples/uprobe_syscall (fixtures/uprobe_syscall.c, one
subcommand per case, key=value output). The BPF programs and the bpf_testmod module
become Python consumers attached through the Machine API; in the ``check`` cases the
guest calls ``checkpoint(op)`` and a consumer on it attaches ('A' entry, 'U' return)
or detaches ('D') the probe under test, or records ``executed`` ('R'), so that
attach/detach happen exactly where the selftest does them and the guest reads its own
/proc/self/maps. Case numbers follow the spec 6 tables (1-11, W1-W7, U2/U3).
"""

from __future__ import annotations

import errno
import struct
from collections.abc import Callable, Set
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import attach_exe

from emu.abi import Signal
from emu.designs import DESIGNS
from emu.errors import UsageError
from emu.guestio import GuestIO
from emu.kernel.uprobes.consumers import Consumer, Hit
from emu.kernel.uprobes.regs import PtRegs
from emu.machine import Attachment, Machine, RunOptions, RunResult

SAMPLE = str(Path(__file__).resolve().parent.parent / "elf_samples" / "uprobe_syscall")
ALL_DESIGNS = list(DESIGNS)
U64 = (1 << 64) - 1

# struct pt_regs word order (spec 6)
WORDS = ("r15", "r14", "r13", "r12", "rbp", "rbx", "r11", "r10", "r9", "r8", "rax", "rcx", "rdx", "rsi", "rdi",
         "orig_rax", "rip", "cs", "eflags", "rsp", "ss")
NOT_SET_BY_UPROBE_REGS = {"orig_rax", "rip", "cs", "rsp", "ss"}  # the selftest does not compare these

# What each design makes of an optimizable site (DESIGN.md table; spec 1.2, 1.5)
OPT_KIND = {"linux-6.18": "call", "jmp-slots": "jmp", "nop10": "leacall"}
OPT_PATH = {"linux-6.18": "call", "jmp-slots": "jmp", "nop10": "call"}
# syscall 336 from normal code (spec 2.1, 3.8; DESIGN.md): no such syscall before 6.18
UPROBE_ERRNO = {"int3": errno.ENOSYS, "uretprobe-rfc": errno.ENOSYS, "linux-6.18": errno.ENXIO,
                "jmp-slots": errno.EPROTO, "nop10": errno.EPROTO}
HAS_335 = {"linux-6.18", "jmp-slots", "nop10"}
JMP_SLOT = bytes.fromhex("488d64248051415350b8500100000f05")  # DESIGN.md, jmp-slots
NOP5 = bytes.fromhex("0f1f440000")
NOP10 = bytes.fromhex("662e0f1f840000000000")


# ------------------------------------------------------------------ plumbing

def parse(out: str) -> dict[str, str]:
    """key=value lines (value = rest of the line)."""
    kv: dict[str, str] = {}
    for line in out.splitlines():
        key, sep, value = line.partition("=")
        assert sep, f"not a key=value line: {line!r}"
        kv[key] = value
    return kv


@dataclass
class Run:
    machine: Machine
    result: RunResult
    out: str
    kv: dict[str, str]


def run_guest(design: str, *args: str, setup: Callable[[Machine], object] | None = None) -> Run:
    io = GuestIO.captured()
    m = Machine(SAMPLE, [SAMPLE, *args], {}, RunOptions(design=design), io)
    if setup is not None:
        setup(m)
    result = m.run()
    out = io.out.decode()
    assert io.err.decode() == ""
    return Run(m, result, out, parse(out))


def words(text: str) -> dict[str, int]:
    values = [int(w, 16) for w in text.split()]
    assert len(values) == len(WORDS)
    return dict(zip(WORDS, values, strict=True))


def regs_words(regs: PtRegs) -> dict[str, int]:
    return dict(zip(WORDS, struct.unpack("<21Q", regs.pack()), strict=True))


def differing(a: dict[str, int], b: dict[str, int], skip: Set[str] = frozenset()) -> dict[str, tuple[str, str]]:
    """Words that differ (name -> (hex a, hex b)), ignoring ``skip``."""
    return {n: (hex(a[n]), hex(b[n])) for n in WORDS if n not in skip and a[n] != b[n]}


def expected_exits(design: str, sys_uprobe_hits: int, sys_uretprobe_hits: int) -> dict[str, int]:
    """How each design leaves its syscalls (spec 2.0-2.2; DESIGN.md): the fast paths force SYSRET,
    jmp-slots' sys_uprobe and the RFC's uretprobe syscall always IRET."""
    exits = {"sysret": 0, "iret": 0}
    if design == "linux-6.18" or design == "nop10":
        exits["sysret"] += sys_uprobe_hits
    elif design == "jmp-slots":
        exits["iret"] += sys_uprobe_hits
    if design in HAS_335:
        exits["sysret"] += sys_uretprobe_hits
    elif design == "uretprobe-rfc":
        exits["iret"] += sys_uretprobe_hits
    return {k: v for k, v in exits.items() if v}


# The selftest's nop5 trigger under every design, plus a nop10 copy (uprobe_regs_trigger_nop10 /
# uprobe_regs_nop10) under the nop10 design, the only one that accepts and optimizes it.
TRIGGERS = [pytest.param(d, "nop5", id=f"{d}-nop5") for d in ALL_DESIGNS] + [pytest.param("nop10", "nop10", id="nop10-nop10")]
TRIGGER_SYMBOL = {"nop5": "uprobe_regs_trigger", "nop10": "uprobe_regs_trigger_nop10"}


def optimized(design: str, trigger: str) -> bool:
    """Whether the design optimizes this trigger's long NOP after its first hit (spec 3.1, 3.8)."""
    return design in ("linux-6.18", "jmp-slots") if trigger == "nop5" else design == "nop10"


def regs_run(design: str, trigger: str, pre: int, consumer: Consumer, kind: str = "uprobe") -> tuple[Run, Attachment]:
    box: list[Attachment] = []
    sym = TRIGGER_SYMBOL[trigger]
    run = run_guest(design, "regs", str(pre), trigger, setup=lambda m: box.append(attach_exe(m, f"{kind}:{sym}", consumer)))
    assert run.result.exit_status == 0, run.result.message
    assert int(run.kv["trigger"], 16) == run.machine.resolver.symbols[sym][0]
    return run, box[0]


def assert_after_equals_before(before: dict[str, int], after: dict[str, int]) -> None:
    """uprobe_regs: every word survives the probed call except rax = the return value."""
    assert after["rax"] == 0xDEADBEEF
    assert differing(before, after, {"rax"}) == {}


# ------------------------------------------------ 1 / 10: uprobe_regs_equal

@pytest.mark.parametrize("pre", [0, 1], ids=["selftest", "entry-optimized-first"])
@pytest.mark.parametrize(("design", "trigger"), TRIGGERS)
def test_1_uretprobe_regs_equal(design: str, trigger: str, pre: int) -> None:
    """Spec 6 #1: a uretprobe's consumer sees the registers the caller gets back (rax = return value)."""
    seen: list[PtRegs] = []
    run, att = regs_run(design, trigger, pre, Consumer(ret_handler=lambda hit: seen.append(hit.regs.copy())),
                        "uretprobe")
    before, after = words(run.kv["before"]), words(run.kv["after"])
    assert_after_equals_before(before, after)
    assert len(seen) == pre + 1
    prog = regs_words(seen[-1])
    assert differing(prog, after, NOT_SET_BY_UPROBE_REGS) == {}
    # Beyond the selftest: the return handler runs with ip = the real return address (inside
    # uprobe_regs) and sp already past the return (spec 5.2); pt_regs from a trap/syscall has -1.
    start, size = run.machine.resolver.symbols["uprobe_regs_nop10" if trigger == "nop10" else "uprobe_regs"]
    assert start < prog["rip"] < start + size
    assert prog["rsp"] == before["rsp"] - 8  # uprobe_regs pushed %rsi before the call
    assert prog["orig_rax"] == U64
    # the entry NOP is optimized after its first hit where the design can
    entry = {"int3": 1, OPT_PATH[design]: pre} if optimized(design, trigger) else {"int3": pre + 1}
    assert {k: v for k, v in att.consumer.paths.items() if v} == {k: v for k, v in entry.items() if v}
    sys_uprobe = pre if optimized(design, trigger) else 0
    assert run.result.exits == expected_exits(design, sys_uprobe, pre + 1)


@pytest.mark.parametrize(("design", "trigger"), TRIGGERS)
def test_10_uprobe_regs_equal(design: str, trigger: str) -> None:
    """Spec 6 #10: the entry consumer on the (optimized) nop5 sees rax, rcx and r11 as they were
    before the trampoline pushed them, and every other word as the program has it."""
    seen: list[PtRegs] = []
    run, att = regs_run(design, trigger, 1, Consumer(handler=lambda hit: seen.append(hit.regs.copy())))
    before, after = words(run.kv["before"]), words(run.kv["after"])
    assert_after_equals_before(before, after)
    assert len(seen) == 2
    prog = regs_words(seen[-1])
    assert prog["rax"] == before["rax"]  # not 0xdeadbeef, not 336
    assert differing(prog, after, NOT_SET_BY_UPROBE_REGS | {"rax"}) == {}
    # Beyond the selftest (spec 2.1 step 7, 4.4): consumers see the "INT3 at vaddr" state on every path.
    assert prog["rip"] == att.address == run.machine.resolver.symbols[TRIGGER_SYMBOL[trigger]][0]
    assert prog["rsp"] == before["rsp"] - 16  # %rsi pushed, then the return address of the call
    assert (prog["orig_rax"], prog["cs"], prog["ss"]) == (U64, 0x33, 0x2B)
    assert att.consumer.paths == ({"int3": 1, OPT_PATH[design]: 1} if optimized(design, trigger) else {"int3": 2})
    assert run.result.exits == expected_exits(design, 1 if optimized(design, trigger) else 0, 0)


def test_10_regs_equal_catches_a_clobbered_register() -> None:
    """Negative control: a consumer that changes rdx on the optimized path must show up as a difference."""
    def clobber(hit: Hit) -> None:
        hit.regs.dx ^= 0xFF

    run, att = regs_run("linux-6.18", "nop5", 1, Consumer(handler=clobber))
    before, after = words(run.kv["before"]), words(run.kv["after"])
    assert att.consumer.paths == {"int3": 1, "call": 1}
    assert differing(before, after, {"rax"}) == {"rdx": (hex(before["rdx"]), hex(before["rdx"] ^ 0xFF))}


# ------------------------------------------------------------ 11: regs_change

@pytest.mark.parametrize(("design", "trigger"), TRIGGERS)
def test_11_regs_change(design: str, trigger: str) -> None:
    """Spec 6 #11 (bpf_testmod consumer): rcx set at entry, rax and r11 set on return, all reach the caller."""
    def entry(hit: Hit) -> None:
        hit.regs.cx = 0x87654321FEEBDAED

    def ret(hit: Hit) -> None:
        hit.regs.ax = 0x12345678DEADBEEF
        hit.regs.r11 = U64

    run, att = regs_run(design, trigger, 1, Consumer(handler=entry, ret_handler=ret))
    before, after = words(run.kv["before"]), words(run.kv["after"])
    assert after["rax"] == 0x12345678DEADBEEF
    assert after["rcx"] == 0x87654321FEEBDAED
    assert after["r11"] == U64
    assert differing(before, after, {"rax", "rcx", "r11"}) == {}  # eflags and rsp included
    assert (att.consumer.hits, att.consumer.ret_hits) == (2, 2)


# ------------------------------------------------------ 2: uretprobe_syscall_call

@pytest.mark.parametrize("design", ALL_DESIGNS)
def test_2_uretprobe_syscall_call(design: str) -> None:
    """Spec 6 #2 / 5.3: syscall 335 from a fake trampoline inside a uretprobed function: SIGILL, no handler.
    Designs without syscall 335 return -ENOSYS; the uretprobe then fires normally."""
    executed: list[int] = []
    run = run_guest(design, "syscall_call", "335", setup=lambda m: m.attach(
        "uretprobe:uretprobe_syscall_call", Consumer(ret_handler=lambda hit: executed.append(hit.regs.ip))))
    if design in HAS_335:
        assert (run.result.exit_status, run.result.signal) == (128 + Signal.SIGILL, Signal.SIGILL)
        assert run.out == "calling=1\n"
        assert executed == []
    else:
        assert (run.result.exit_status, run.result.signal) == (0, None)
        assert run.kv == {"calling": "1", "ret": str(-errno.ENOSYS)}
        assert len(executed) == 1


def test_2_uretprobe_syscall_call_rfc_number() -> None:
    """The RFC's uretprobe syscall (462) from outside its trampoline: SIGILL too (DESIGN.md)."""
    executed: list[int] = []
    run = run_guest("uretprobe-rfc", "syscall_call", "462", setup=lambda m: m.attach(
        "uretprobe:uretprobe_syscall_call_rfc", Consumer(ret_handler=lambda hit: executed.append(1))))
    assert (run.result.exit_status, run.result.signal) == (128 + Signal.SIGILL, Signal.SIGILL)
    assert run.out == "calling=1\n" and executed == []


# ------------------------------------------------------------ 9: uprobe_error

@pytest.mark.parametrize("design", ALL_DESIGNS)
def test_9_uprobe_error(design: str) -> None:
    """Spec 6 #9 / W8: syscall(336) from normal code fails with the design's errno, no signal."""
    run = run_guest(design, "error")
    assert run.result.exit_status == 0
    assert run.kv == {"ret": "-1", "errno": str(UPROBE_ERRNO[design])}


# ------------------------------------------- 4-7, W1-W6: check() on one site

@dataclass
class Tracer:
    """The 'BPF side' of check(): attaches/detaches at the guest's checkpoints and counts."""

    machine: Machine
    entry_spec: str
    ret_spec: str | None
    session: bool = False
    executed: int = 0
    snapshots: list[int] = field(default_factory=list)
    ips: list[tuple[str, int]] = field(default_factory=list)
    closed: list[dict[str, int]] = field(default_factory=list)  # paths of each consumer at detach
    current: Attachment | None = None

    def count(self, hit: Hit) -> None:
        self.executed += 1
        self.ips.append((hit.path.value, hit.regs.ip))

    def session_entry(self, hit: Hit) -> None:
        self.count(hit)
        hit.cookie = ("cookie", hit.regs.ip)

    def session_return(self, hit: Hit) -> None:
        assert hit.cookie == ("cookie", hit.func)  # the session cookie travels to the return
        self.executed += 1

    def checkpoint(self, hit: Hit) -> None:
        op = chr(hit.regs.di)
        if op == "A":
            consumer = (Consumer(handler=self.session_entry, ret_handler=self.session_return, session=True)
                        if self.session else Consumer(handler=self.count))
            self.current = attach_exe(self.machine, self.entry_spec, consumer)
        elif op == "U":
            assert self.ret_spec is not None
            self.current = attach_exe(self.machine, self.ret_spec, Consumer(ret_handler=self.count))
        elif op == "D":
            assert self.current is not None
            self.closed.append(dict(self.current.consumer.paths))
            self.current.detach()
        elif op == "R":
            self.snapshots.append(self.executed)
        else:
            raise AssertionError(f"unknown checkpoint {op!r}")


def simulate(design: str, steps: str, session: bool) -> tuple[list[str], list[int], list[dict[str, int]]]:
    """What the kernel does for a step string: per report the site state and ``executed``,
    per detach the consumer's entry paths (the first hit after attach traps, spec 3.3)."""
    optimizes = design in OPT_KIND
    kinds: list[str] = []
    counts: list[int] = []
    paths: list[dict[str, int]] = []
    attached: str | None = None
    hits = executed = 0
    ever_optimized = False
    for step in steps:
        if step in "AU":
            attached, hits = step, 0
        elif step == "D":
            paths.append({"int3": 1, OPT_PATH[design]: hits - 1} if optimizes and hits > 1
                         else ({"int3": hits} if hits else {}))
            attached = None
        elif step == "T" and attached:
            hits += 1
            ever_optimized |= optimizes
            executed += 2 if attached == "A" and session else 1
        elif step == "R":
            counts.append(executed)
            if attached:
                kinds.append(OPT_KIND[design] if optimizes and hits else "int3")
            else:
                # nop10 unoptimize leaves `eb 08` over the stale tail (WIP10, spec 1.5)
                kinds.append("jmp8" if design == "nop10" and ever_optimized else "nop")
    return kinds, counts, paths


CHECK_CASES = {
    # case: (site for nop5 designs, site for nop10, entry spec, return spec, session)
    "4-uprobe_legacy": ("nop5", "nop10", "uprobe:{sym}", "uretprobe:{sym}", False),
    "5-uprobe_multi": ("nop5", "nop10", "uprobe:{addr:#x}", "uretprobe:{addr:#x}", False),
    "6-uprobe_session": ("nop5", "nop10", "uprobe:{sym}", None, True),
    "7-uprobe_usdt": ("usdt5", "usdt10", "usdt:optimized_uprobe:{usdt}", None, False),
}
SITE_SYMBOL = {"nop5": "uprobe_test", "nop10": "uprobe_test_nop10", "usdt5": "usdt_test_site",
               "usdt10": "usdt_test_nop10_site"}
FORMS = {
    # the 6.18 selftest: attach, trigger x2, check_attach, detach, check_detach (then the uretprobe)
    "selftest": "ATTRDR",
    # W3-W6 (nop10 WIP): ... then reattach/detach without triggering, check_detach, one call that
    # must not count, reattach and check again
    "reattach": "ATTRDRADRTATTRDR",
}


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("case", list(CHECK_CASES))
@pytest.mark.parametrize("design", ALL_DESIGNS)
def test_check(design: str, case: str, form: str) -> None:
    """Spec 6 #4-#7 and W1-W6: executed counts, the site bytes and the guest's own /proc/self/maps."""
    site5, site10, entry_fmt, ret_fmt, session = CHECK_CASES[case]
    site = site10 if design == "nop10" else site5
    steps = FORMS[form] + ("UTTRDR" if ret_fmt else "")
    io = GuestIO.captured()
    m = Machine(SAMPLE, [SAMPLE, "check", site, steps], {}, RunOptions(design=design), io)
    sym = SITE_SYMBOL[site]
    addr = m.resolver.symbols[sym][0]
    names = {"sym": sym, "addr": addr, "usdt": "usdt10" if site == "usdt10" else "usdt"}
    tracer = Tracer(m, entry_fmt.format(**names), ret_fmt.format(**names) if ret_fmt else None, session)
    m.attach("uprobe:checkpoint", Consumer(handler=tracer.checkpoint))
    result = m.run()
    out = io.out.decode()
    assert result.exit_status == 0, (result.message, out)
    kv = parse(out)

    kinds, counts, paths = simulate(design, steps, session)
    assert int(kv["site"], 16) == addr
    if site.startswith("usdt"):
        assert int(kv["scan"], 16) == addr  # the selftest's scan finds the long NOP the note points at
    assert int(kv["reports"]) == len(kinds)
    assert tracer.snapshots == counts  # the selftest's `executed`
    site_len = 10 if site in ("nop10", "usdt10") else 5
    for k, kind in enumerate(kinds):
        r = {key[len(f"r{k}."):]: v for key, v in kv.items() if key.startswith(f"r{k}.")}
        code = bytes.fromhex(r["bytes"])
        assert (r["kind"], int(r["at"], 16)) == (kind, addr), (k, r)
        if kind == "nop":
            assert code[:site_len] == (NOP10 if site_len == 10 else NOP5)
        if design not in OPT_KIND:
            assert (r["map"], r["ntramp"]) == ("none", "0"), (k, r)
            continue
        # W1 / spec 1.2, 1.5: the call targets the first byte of an r-xp [uprobes-trampoline] mapping,
        # which is never unmapped, also after detach (spec 3.4, check_detach)
        line = r["map"].split()
        start, end = (int(x, 16) for x in line[0].split("-"))
        assert (line[1], line[-1], r["ntramp"]) == ("r-xp", "[uprobes-trampoline]", "1"), (k, r)
        if kind in ("call", "leacall", "jmp"):
            target = int(r["target"], 16)
            if kind == "leacall":
                assert code[:6] == bytes.fromhex("488d642480e8")
            if kind == "jmp":  # a 16-byte slot of the slot page
                assert start <= target < end and (target - start) % 16 == 0
                assert m.mem.read(target, 16) == JMP_SLOT
            else:
                assert target == start, (k, r)
        if kind == "jmp8":
            assert code[:2] == bytes.fromhex("eb08")  # W2
    # the first hit after each attach traps, later ones take the design's optimized path (spec 3.3)
    assert tracer.closed == paths
    assert {ip for path, ip in tracer.ips if path != "return"} <= {addr}  # ip = probe address on every path


# --------------------------------------------------- U2 / U3: usdt nop combos

@pytest.mark.parametrize("usdt", ["usdt_1", "usdt_2", "usdt_3"])
@pytest.mark.parametrize("design", ALL_DESIGNS)
def test_usdt_optimized_attach(design: str, usdt: str) -> None:
    """Spec 6 U2/U3 and 3.8: a single 90 stays INT3 (`*addr == 0xcc`); a nop1+long-NOP combo moves to +1
    only when the design optimizes that long NOP; consumers see ip == the probe address on every path."""
    io = GuestIO.captured()
    m = Machine(SAMPLE, [SAMPLE, "check", usdt, "ATTRDR"], {}, RunOptions(design=design), io)
    site = m.resolver.symbols[f"{usdt}_site"][0]
    tracer = Tracer(m, f"usdt:optimized_attach:{usdt}", None)
    m.attach("uprobe:checkpoint", Consumer(handler=tracer.checkpoint))
    result = m.run()
    assert result.exit_status == 0, result.message
    kv = parse(io.out.decode())
    moves = (usdt, design) in {("usdt_2", "linux-6.18"), ("usdt_2", "jmp-slots"), ("usdt_3", "nop10")}
    probe = site + 1 if moves else site
    assert tracer.snapshots == [2, 2]
    assert [ip for _, ip in tracer.ips] == [probe, probe]
    assert [p for p, _ in tracer.ips] == (["int3", OPT_PATH[design]] if moves else ["int3", "int3"])
    assert int(kv["r0.at"], 16) == probe
    if moves:
        assert kv["r0.head"] == "90"  # the 1-byte nop is untouched
        assert kv["r0.kind"] == OPT_KIND[design]
        if design == "nop10":
            assert kv["r0.bytes"].startswith("488d642480e8")
    else:
        assert "r0.head" not in kv
        assert kv["r0.bytes"][:2] == "cc"  # *addr == 0xcc: the probe stays on the 90
    # after detach: the 90 is back (or was never touched) and the long NOP is restored / jumped over
    if usdt == "usdt_1":
        assert (kv["r1.at"], kv["r1.bytes"][:4]) == (hex(site), "90c3")
    else:
        assert (kv["r1.head"], kv["r1.at"]) == ("90", hex(site + 1))
        assert kv["r1.kind"] == ("jmp8" if moves and design == "nop10" else "nop")


# ------------------------------------------------------------- W7: red zone

RED_ZONE_EXPECTED = {
    # 6.18's trampoline pushes clobber -8..-32(%rsp) from the first optimized hit on (notes key fact 1)
    ("linux-6.18", "nop5"): [0] + [1] * 9,
}


@pytest.mark.parametrize("site", ["nop5", "nop10"])
@pytest.mark.parametrize("design", ALL_DESIGNS)
def test_w7_uprobe_red_zone(design: str, site: str) -> None:
    """W7: uprobe_red_zone_test called 10 times; 0 = the three red-zone words survived the probed NOP."""
    spec = f"uprobe:uprobe_red_zone_site_{site}"
    if site == "nop10" and design != "nop10":
        # 66 2e ...: the CS prefix is refused by uprobe_init_insn outside the nop10 design (spec 4.1)
        m = Machine(SAMPLE, [SAMPLE, "redzone", site, "10"], {}, RunOptions(design=design), GuestIO.captured())
        with pytest.raises(UsageError, match="ENOTSUPP"):
            m.attach(spec)
        return
    box: list[Attachment] = []
    run = run_guest(design, "redzone", site, "10", setup=lambda m: box.append(attach_exe(m, spec)))
    assert run.result.exit_status == 0
    assert [int(x) for x in run.kv["rz"].split(",")] == RED_ZONE_EXPECTED.get((design, site), [0] * 10)
    assert box[0].summary()["hits"] == 10
