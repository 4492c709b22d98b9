"""The check page's aggregation, without a browser: hits grouped by site and write pattern, writers
classified, and a 10,000-hit result drawn in a page of a few tens of KB."""

from __future__ import annotations

from pathlib import Path

import pytest

from emu.check import DesignReport
from emu.report.check_page import page, redzone_patterns, writer_kind
from emu.report.hitpath import HitPath
from emu.violations import Check, Violation, ViolationLog

SITE = 0x40186F
PUSHES = {-8: "call 0x3ff000", -16: "push rcx", -24: "push r11", -32: "push rax"}
PCS = {-8: SITE, -16: 0x3FF000, -24: 0x3FF001, -32: 0x3FF003}


class Pages:
    """A HitTracer stand-in: the trampoline page at 0x3ff000, the site at SITE."""

    paths: list[HitPath] = []

    def where(self, pc: int) -> str:
        return "site" if pc == SITE else "[uprobes-trampoline]" if 0x3FF000 <= pc < 0x400000 else "guest"


def clobber(hit: int, offset: int, writer: str | None = None) -> Violation:
    new = (hit * 0x9E3779B97F4A7C15 & (1 << 64) - 1).to_bytes(8, "little").hex()  # a different value each hit
    who = writer or f"guest code at {PCS[offset]:#x}: {PUSHES[offset]}"
    return Violation(Check.REDZONE, "uprobe:rz_nop5_site", SITE, "...",
                     {"offset": offset, "size": 8, "old": "00" * 8, "new": new, "writer": who, "path": "call"}, hit)


def test_writers_are_classified_by_where_the_store_ran() -> None:
    pages = Pages()
    assert writer_kind("guest code at 0x3ff003: push rax", pages)[0] == "trampoline"
    assert writer_kind(f"guest code at {SITE:#x}: call 0x3ff000", pages)[0] == "trampoline"
    assert writer_kind("guest code at 0x401000: mov qword ptr [rsp - 8], rax", pages)[0] == "guest"
    assert writer_kind("the fake kernel (copy_to_user)", pages)[0] == "kernel"


def test_hits_with_the_same_writes_are_one_row_and_a_different_writer_is_another() -> None:
    found = [clobber(hit, off) for hit in range(2, 102) for off in PUSHES]
    found += [clobber(200, -8, "the fake kernel (copy_to_user)")]
    patterns = redzone_patterns(found, Pages())
    assert [len(p.hits) for p in patterns] == [100, 1]
    assert [w.offset for w in patterns[0].writes] == [-32, -24, -16, -8]
    assert {w.kind for w in patterns[0].writes} == {"trampoline"}
    assert [(w.offset, w.kind) for w in patterns[1].writes] == [(-8, "kernel")]
    assert len(patterns[0].distinct) == 100


def test_a_10000_hit_run_stays_small(tmp_path: Path) -> None:
    found = [clobber(hit, off) for hit in range(1, 10_001) for off in PUSHES]
    report = DesignReport("linux-6.18", 10_000, ViolationLog.of(found), False, "syscall #3: ...", {"sysret": 9999}, trace=Pages())
    clean = DesignReport("jmp-slots", 10_000, ViolationLog(), True, None, {"iret": 9999})
    size = page([report, clean], "uprobe-emu check x").write(str(tmp_path / "p.html"))
    assert size < 200_000
    assert (tmp_path / "p.html").read_text().count('data-writer-kind="trampoline"') == 4


def test_a_store_is_lost_only_where_the_broken_bytes_meet_it() -> None:
    from emu.report.fuzz_page import Evidence

    ev = Evidence.of({"violations": ["redzone: ... rsp-8 (8 bytes) 00 -> 11 by guest code at 0x401411: call 0x400000"],
                      "differences": ["call 2 read rsp-40/4: expected 0001, found 0000"]})
    assert ev.pcs == {0x401411}
    assert ev.overlaps(2, 2) and ev.overlaps(16, 16) and ev.overlaps(40, 4) and ev.overlaps(38, 1)
    assert not ev.overlaps(16, 8) and not ev.overlaps(48, 8) and not ev.overlaps(36, 4)


def test_a_long_campaigns_curve_is_drawn_through_a_bounded_number_of_points() -> None:
    from emu.report.fuzz_page import MAX_STEPS, _steps

    def at(x: float, n: int) -> tuple[float, float]:
        return x, n

    assert _steps([3, 7], 0, 10, at) == [(0, 0), (3, 0), (3, 1), (7, 1), (7, 2), (10, 2)]
    many = _steps(list(range(0, 20_000, 2)), 0, 20_000, at)
    assert len(many) == MAX_STEPS + 1 and many[0] == (0, 1) and many[-1] == (20_000, 10_000)


def test_page_text_is_escaped() -> None:
    from emu.report.html import Page

    p = Page("<script>x</script>", "a & b")
    p.para("<img src=x>")
    p.table(("<b>",), [("<i>",)])
    text = p.render()
    assert "<script>" not in text and "<img" not in text and "<b>" not in text and "&lt;img src=x&gt;" in text


def test_recording_a_hits_path_changes_nothing_the_check_finds() -> None:
    from conftest import sample

    from emu.check import CheckRequest, run_check
    from emu.report.hitpath import HitTracer

    def request(tracer: object) -> CheckRequest:
        return CheckRequest(sample("redzone_probe"), ["redzone_probe", "3"], {}, designs=("linux-6.18", "jmp-slots"),
                            tracer=tracer)  # type: ignore[arg-type]

    plain, traced = run_check(request(None)), run_check(request(HitTracer))
    assert [(r.hits, [v.line() for v in r.violations], r.same_output, r.exits) for r in traced] == \
        [(r.hits, [v.line() for v in r.violations], r.same_output, r.exits) for r in plain]
    paths = {r.design: [(p.path, p.exit, p.kernel_at >= 0) for p in r.trace.paths] for r in traced}
    assert paths == {"linux-6.18": [("int3", "none", True), ("call", "sysret", True)],
                     "jmp-slots": [("int3", "none", True), ("jmp", "iret", True)]}
    assert all(r.trace.finished for r in traced)  # every site followed to a non-INT3 hit: the hooks are gone


LIBC = "/lib/x86_64-linux-gnu/libc.so.6"


@pytest.mark.skipif(not (Path(LIBC).exists() and Path("/bin/echo").exists()), reason="needs Debian's /bin/echo and libc")
def test_a_library_probe_placed_at_its_mapping_is_followed_too() -> None:
    from emu.check import CheckRequest, run_check
    from emu.report.hitpath import HitTracer

    [report] = run_check(CheckRequest("/bin/echo", ["echo", "hi"], {}, specs=(f"uprobe:{LIBC}:write",),
                                      designs=("int3",), tracer=HitTracer))
    assert [(p.probe, p.path, p.steps[0].text) for p in report.trace.paths] == [(f"uprobe:{LIBC}:write", "int3", "int3")]
