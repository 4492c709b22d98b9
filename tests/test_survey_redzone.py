"""The static red-zone analysis (emu/survey): fixture sites with known answers, per design."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import sample

from emu.asm import assemble
from emu.designs import DESIGNS, Design, Handler, Patch, Trampoline
from emu.survey.analyze import FileSurvey, survey_file
from emu.survey.redzone import Function, analyse
from emu.survey.writes import red_zone_writes

# site -> (red_zone, live bytes, designs the site is a hazard under (True), and unknown under (None))
EXPECTED: dict[str, tuple[str, tuple[tuple[int, int], ...], set[str], set[str]]] = {
    "rz_live": ("live", ((-8, -1),), {"linux-6.18"}, set()),
    "rz_dead": ("dead", (), set(), set()),
    "rz_after": ("dead", (), set(), set()),
    "rz_above": ("dead", (), set(), set()),
    "rz_deep": ("live", ((-120, -113),), set(), set()),
    "rz_branch": ("live", ((-16, -9),), {"linux-6.18"}, set()),
    "rz_killed": ("dead", (), set(), set()),
    "rz_frame": ("live", ((-4, -1),), {"linux-6.18"}, set()),
    "rz_nop10": ("live", ((-8, -1),), set(), set()),
    "rz_indirect": ("unknown", (), set(), {"linux-6.18"}),
    "rz_rsp_lost": ("unknown", (), set(), {"linux-6.18"}),
}


@pytest.fixture(scope="module")
def cases() -> FileSurvey:
    return survey_file(sample("survey_cases"), None, list(DESIGNS.values()))


def _site(result: FileSurvey, function: str):  # type: ignore[no-untyped-def]
    found = [s for s in result.sites if s.symbol is not None and s.symbol.split("+")[0] == function]
    assert len(found) == 1, [s.symbol for s in result.sites]
    return found[0]


@pytest.mark.parametrize("function", sorted(EXPECTED))
def test_fixture_site_classified_per_design(cases: FileSurvey, function: str) -> None:
    state, live, hazards, unknowns = EXPECTED[function]
    site = _site(cases, function)
    assert (site.red_zone, site.live) == (state, live), site.reason
    assert {d for d, h in site.hazard.items() if h is True} == hazards
    assert {d for d, h in site.hazard.items() if h is None} == unknowns
    assert (site.reason is None) == (state != "unknown")


def test_nop10_site_is_optimized_only_by_nop10(cases: FileSurvey) -> None:
    site = _site(cases, "rz_nop10")
    assert [d for d in site.verdicts if site.optimized(d)] == ["nop10"]
    assert not site.hazard["nop10"]  # optimized, but its lea steps below every live byte


def test_unknown_reasons_name_the_cause(cases: FileSurvey) -> None:
    assert "indirect jump" in (_site(cases, "rz_indirect").reason or "")
    assert "rsp" in (_site(cases, "rz_rsp_lost").reason or "")


def test_builtin_designs_red_zone_writes() -> None:
    writes = {name: red_zone_writes(d) for name, d in DESIGNS.items()}
    assert writes == {"int3": (), "uretprobe-rfc": (), "linux-6.18": ((-32, -1),), "jmp-slots": (), "nop10": ()}


def _slot_design(name: str, step: int) -> Design:
    """A jmp-slot design whose slot steps ``step`` bytes down before its pushes."""
    lea = f"lea -{step}(%rsp),%rsp; " if step else ""
    return Design(name, patch=Patch("nop5", branch="jmp"),
                  trampoline=Trampoline(f"{lea}push %rcx; push %r11; push %rax; mov $336,%eax; syscall",
                                        layout="slots", slot_size=32),
                  handler=Handler(probe_from="slot", sp_skip=step, exit="iret")).validate()


def test_user_design_writes_come_from_its_code() -> None:
    """Negative control of the design table: the same mechanism with a shorter step hits other bytes."""
    assert red_zone_writes(_slot_design("no-step", 0)) == ((-24, -1),)
    assert red_zone_writes(_slot_design("short-step", 96)) == ((-120, -97),)
    assert red_zone_writes(_slot_design("full-step", 128)) == ()


def test_hazard_follows_user_design_writes() -> None:
    designs = [_slot_design("no-step", 0), _slot_design("short-step", 96)]
    result = survey_file(sample("survey_cases"), None, designs)
    live, deep = _site(result, "rz_live"), _site(result, "rz_deep")
    assert live.hazard == {"no-step": True, "short-step": False}
    assert deep.hazard == {"no-step": False, "short-step": True}  # rsp-120 is hit once the step is short


def _fn(text: str) -> tuple[Function, int]:
    """A function from AT&T text; the site is the 5-byte NOP."""
    code = assemble(text, 0x1000)
    fn = Function.build(code, 0x1000)
    site = next(a for a, i in fn.insns.items() if i.raw == bytes.fromhex("0f1f440000"))
    return fn, site


NOP5 = ".byte 0x0f, 0x1f, 0x44, 0x00, 0x00"  # keystone encodes `nopl 0(%rax,%rax,1)` otherwise


@pytest.mark.parametrize(("text", "state", "live"), [
    (f"mov %rdi,-8(%rsp); {NOP5}; mov -8(%rsp),%rax; ret", "live", ((-8, -1),)),
    (f"mov %rdi,-8(%rsp); {NOP5}; mov -16(%rsp),%rax; ret", "dead", ()),  # read elsewhere
    (f"mov %edi,-8(%rsp); {NOP5}; mov -8(%rsp),%rax; ret", "live", ((-8, -5),)),  # only the stored half
    (f"mov %rdi,-8(%rsp); call 0x2000; {NOP5}; mov -8(%rsp),%rax; ret", "dead", ()),  # the callee owns it
    (f"mov %rdi,-8(%rsp); {NOP5}; call 0x2000; mov -8(%rsp),%rax; ret", "dead", ()),
    (f"mov %rdi,-8(%rsp); {NOP5}; sub $16,%rsp; mov 8(%rsp),%rax; add $16,%rsp; ret", "live", ((-8, -1),)),
    (f"mov %rdi,-8(%rsp); {NOP5}; push %rax; mov (%rsp),%rax; pop %rax; ret", "dead", ()),  # the push overwrites
    (f"mov %rdi,-8(%rsp); {NOP5}; addq $1,-8(%rsp); ret", "live", ((-8, -1),)),  # read-modify-write reads
    (f"mov %rdi,-8(%rsp); {NOP5}; mov -8(%rsp,%rcx,1),%rax; ret", "unknown", ()),
    (f"lea -8(%rsp),%rdx; mov %rdi,(%rdx); {NOP5}; mov -8(%rsp),%rax; ret", "live", ((-8, -1),)),
    (f"lea -8(%rsp),%rdx; mov %rdi,(%rdx); mov $0,%edx; {NOP5}; mov (%rdx),%rax; ret", "dead", ()),
    (f"mov %rdi,-8(%rsp); test %eax,%eax; jne done; {NOP5}; done: mov -8(%rsp),%rax; ret", "live", ((-8, -1),)),
    (f"jmp done; {NOP5}; done: ret", "unknown", ()),  # unreachable padding
])
def test_small_functions(text: str, state: str, live: tuple[tuple[int, int], ...]) -> None:
    fn, site = _fn(text)
    rz = analyse(fn, site)
    assert (rz.state, rz.live) == (state, live), rz.reason


def test_json_row_has_the_issue_schema(cases: FileSurvey) -> None:
    row = next(r for r in cases.to_json() if r["symbol"].startswith("rz_live"))
    assert {"file", "address", "symbol", "kind", "red_zone", "live_bytes", "hazard"} <= set(row)
    assert row["live_bytes"] == [[-8, -1]] and row["hazard"]["linux-6.18"] is True


def test_a_design_is_compared_by_value() -> None:
    """red_zone_writes caches per design: an equal copy gives the same answer, a changed one its own."""
    base = DESIGNS["linux-6.18"]
    assert red_zone_writes(dataclasses.replace(base)) == red_zone_writes(base)


@pytest.mark.parametrize(("text", "state"), [
    (f"mov %rdi,-8(%rsp); {NOP5}; jmp 0x5000", "dead"),  # a tail call: rsp is back at its entry value
    (f"push %rbx; mov %rdi,-8(%rsp); {NOP5}; jmp 0x5000", "unknown"),  # the function goes on elsewhere
])
def test_jumps_out_of_the_bounds(text: str, state: str) -> None:
    fn, site = _fn(text)
    rz = analyse(fn, site)
    assert rz.state == state, rz.reason
    assert state == "dead" or "bounds" in (rz.reason or "")


@pytest.mark.parametrize(("after", "state", "live"), [
    ("mov -8(%rsp),%rax; ret", "live", ((-8, -1),)),
    ("movq $0,-8(%rsp); mov -8(%rsp),%rax; ret", "dead", ()),
])
def test_a_known_executed_site_entered_from_elsewhere(after: str, state: str, live: tuple[tuple[int, int], ...]) -> None:
    """A USDT site in a split-off part (no direct path from its unwind entry): liveness from the site alone;
    the same unreachable site not known to run is padding, and unknown."""
    fn, site = _fn(f"ret; {NOP5}; {after}")
    rz = analyse(fn, site, executed=True)
    assert (rz.state, rz.live) == (state, live) and "outside" in (rz.reason or "")
    assert analyse(fn, site).state == "unknown"


def test_unwind_bounds_match_the_symbols() -> None:
    """A stripped binary's functions come from .eh_frame_hdr + FDEs: they agree with the symbol table."""
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    from emu.survey.bounds import UnwindBounds

    with open(sample("hello_dynamic"), "rb") as fh:
        elf = ELFFile(fh)
        unwind = UnwindBounds.read(elf)
        symtab = elf.get_section_by_name(".symtab")
        assert unwind is not None and isinstance(symtab, SymbolTableSection)
        symbols = {s.name: (s["st_value"], s["st_size"]) for s in symtab.iter_symbols()}
    start, size = symbols["main"]
    assert unwind.around(start + size - 1) == (start, size)
    assert unwind.around(unwind.starts[0] - 1) is None  # before every FDE


def test_no_unwind_table_no_bounds() -> None:
    from elftools.elf.elffile import ELFFile

    from emu.survey.bounds import UnwindBounds

    with open(sample("survey_cases"), "rb") as fh:  # assembly without CFI directives
        assert UnwindBounds.read(ELFFile(fh)) is None
