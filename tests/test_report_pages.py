"""--html pages rendered in headless Chromium: they load with no console message and no network
request, the screenshot is not blank, the figures are the expected ones, and the content is
what the command found (the check page on the red-zone sample: linux-6.18's four writers)."""

from __future__ import annotations

from pathlib import Path

import browser
import pytest
from conftest import sample

from emu.cli import main

needs_chromium = pytest.mark.skipif(not browser.available(), reason="Debian's chromium is not installed (.ci/run installs it)")
DESIGNS = ("int3", "uretprobe-rfc", "linux-6.18", "jmp-slots", "nop10")
SIX_18_WRITERS = {-8: "call 0x", -16: "push rcx", -24: "push r11", -32: "push rax"}


def loaded(path: Path) -> tuple[browser.Rendered, browser.Dom]:
    """The page rendered; asserts what every page must satisfy."""
    shown = browser.render(path)
    assert shown.console == []
    assert shown.requests == []
    assert browser.inked_fraction(shown.screenshot) > 0.01
    dom = browser.parse(shown.dom)
    assert dom.external == []
    return shown, dom


CheckPage = tuple[Path, browser.Rendered, browser.Dom]


@pytest.fixture(scope="module")
def check_page(tmp_path_factory: pytest.TempPathFactory) -> CheckPage:
    out = tmp_path_factory.mktemp("check") / "check.html"
    assert main(["check", "--clear-env", "--kernel", ",".join(DESIGNS), "--html", str(out), sample("redzone_probe"),
                 "3"]) == 0
    return (out, *loaded(out))


@needs_chromium
def test_check_page_shows_the_four_618_writers_and_every_other_design_clean(check_page: CheckPage) -> None:
    _, _, dom = check_page
    figures = dom.figures()
    maps = [f.attrs["data-design"] for f in figures if f.attrs["data-figure"] == "redzone-map"]
    assert maps == list(DESIGNS)
    writes = {int(e.attrs["data-offset"]): e.attrs for e in dom.inside("redzone-map", design="linux-6.18")
              if "data-offset" in e.attrs}
    assert sorted(writes) == sorted(SIX_18_WRITERS)
    for offset, insn in SIX_18_WRITERS.items():
        assert writes[offset]["data-writer-kind"] == "trampoline"
        assert writes[offset]["data-writer"].startswith(insn)
    for design in DESIGNS:
        if design != "linux-6.18":
            inside = dom.inside("redzone-map", design=design)
            assert not [e for e in inside if "data-offset" in e.attrs]
            assert [e for e in inside if e.attrs.get("data-clean") == "1"]


@needs_chromium
def test_check_page_figures_one_map_per_design_and_one_path_per_kind_of_hit(check_page: CheckPage) -> None:
    _, _, dom = check_page
    figures = dom.figures()
    assert all(len([e for e in dom.elements if e.tag == "svg" and e.figure is f.attrs]) == 1 for f in figures)
    paths = {(f.attrs["data-design"], f.attrs["data-path"]) for f in figures if f.attrs["data-figure"] == "hit-path"}
    # every design traps first; those that optimize show their optimized path too
    assert paths == {(d, "int3") for d in DESIGNS} | {("linux-6.18", "call"), ("jmp-slots", "jmp"), ("nop10", "call")}
    assert len(figures) == len(DESIGNS) + len(paths)
    lanes = [e.attrs["data-lane"] for e in dom.inside("hit-path", design="linux-6.18", path="call") if "data-lane" in e.attrs]
    assert lanes[0] == "guest" and "probe pages" in lanes and "kernel" in lanes and lanes[-1] == "guest"


@needs_chromium
def test_check_page_says_which_output_differs(check_page: CheckPage) -> None:
    path, _, _ = check_page
    text = path.read_text()
    assert "differs from the unprobed run: syscall #" in text
    assert text.count("same output, exit status and syscalls as the unprobed run") == len(DESIGNS) - 1


# Negative controls: each check above fails on a page that breaks its rule.

@needs_chromium
def test_a_page_with_a_script_and_a_remote_image_is_caught(tmp_path: Path) -> None:
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><body><p>x</p><script>console.error("boom")</script>'
                   '<img src="http://example.invalid/x.png"></body></html>')
    shown = browser.render(bad)
    assert any("boom" in line for line in shown.console)
    assert any("example.invalid" in line for line in shown.requests)
    assert browser.parse(shown.dom).external == ["<script>", "<img>", "img src=http://example.invalid/x.png"]


@needs_chromium
def test_a_blank_page_is_caught(tmp_path: Path) -> None:
    blank = tmp_path / "blank.html"
    blank.write_text("<!DOCTYPE html><html><body></body></html>")
    assert browser.inked_fraction(browser.render(blank).screenshot) < 0.001


def test_chromium_service_pings_are_told_apart_from_page_requests() -> None:
    lines = ["CONNECT update.googleapis.com:443 HTTP/1.1", "GET http://clients2.google.com/time/1 HTTP/1.1",
             "GET http://example.org/a.css HTTP/1.1", "CONNECT fonts.example.net:443 HTTP/1.1"]
    assert browser.page_requests(lines) == lines[2:]


@needs_chromium
def test_race_page_grids_every_interleaving_by_outcome(tmp_path: Path) -> None:
    out = tmp_path / "race.html"
    variants = str(Path(__file__).resolve().parent.parent / "examples" / "designs" / "race_variants.py")
    assert main(["race", "--clear-env", "-p", "uprobe:t_nop10", "--event", "detach", "--kernel", "nop10,nop10-restore,int3",
                 "--design-file", variants, "--html", str(out), sample("probe_targets")]) == 0
    _, dom = loaded(out)
    assert [f.attrs["data-design"] for f in dom.figures()] == ["nop10", "nop10-restore"]  # int3 refuses the site
    for design, outcomes in (("nop10", {"clean": 34}), ("nop10-restore", {"clean": 32, "SIGSEGV": 2})):
        cells = [e.attrs for e in dom.inside("race-grid", design=design) if "data-outcome" in e.attrs]
        assert {k: sum(c["data-outcome"] == k for c in cells) for k in outcomes} == outcomes
        assert len(cells) == sum(outcomes.values())
        assert sorted(c["data-outcome"] for c in cells if c.get("data-example")) == sorted(outcomes)
    segv = [e.attrs for e in dom.inside("race-grid", design="nop10-restore") if e.attrs.get("data-outcome") == "SIGSEGV"]
    assert {c["data-insns"] for c in segv} == {"1"}  # stopped after the lea, mid-NOP
    assert "not explored: uprobe:t_nop10" in out.read_text()


def _bar_titles(dom: browser.Dom, kind: str, **data: str) -> dict[tuple[str, str], str]:
    bars = [e for e in dom.inside(kind, **data) if "data-series" in e.attrs]
    titles = {id(e): t.text for e, t in zip(dom.elements, dom.elements[1:], strict=False) if t.tag == "title"}
    return {(e.attrs["data-category"], e.attrs["data-series"]): titles.get(id(e), "") for e in bars}


@needs_chromium
def test_bench_page_bars_each_designs_events_beside_the_published_rates(tmp_path: Path) -> None:
    out = tmp_path / "bench.html"
    assert main(["bench", "--kernel", "linux-6.18,jmp-slots", "--workload", "uprobe-nop5", "--duration", "0.01",
                 "--runs", "1", "--html", str(out)]) == 0
    _, dom = loaded(out)
    assert [f.attrs["data-figure"] for f in dom.figures()] == ["bench-events", "bench-native", "bench-copied",
                                                               "bench-native-fix"]
    events = _bar_titles(dom, "bench-events", workload="uprobe-nop5")
    assert events[("SYSRET", "linux-6.18")] == "SYSRET · linux-6.18: 1 per hit"  # call trampoline, sys_uprobe
    assert events[("IRET", "jmp-slots")] == "IRET · jmp-slots: 1 per hit"  # the slot returns by IRET
    assert events[("IRET", "linux-6.18")].endswith(": 0 per hit")
    assert events[("calls", "jmp-slots")].endswith(": 0 per hit")  # a jmp, nothing pushed
    native = _bar_titles(dom, "bench-native", workload="uprobe-nop5")
    assert native == {("uprobe-nop5", "6.18 commit"): "uprobe-nop5 · 6.18 commit: 7.038 M/s"}


@needs_chromium
def test_fuzz_page_plots_findings_and_marks_each_findings_violating_store(tmp_path: Path) -> None:
    out = tmp_path / "fuzz.html"
    assert main(["fuzz", "--kernel", "linux-6.18,jmp-slots", "--cases", "10", "--out", str(tmp_path / "found"),
                 "--html", str(out)]) == 1
    _, dom = loaded(out)
    kinds = [f.attrs["data-figure"] for f in dom.figures()]
    saved = sorted((tmp_path / "found").glob("*.json"))
    assert kinds == ["fuzz-findings"] + ["fuzz-finding"] * len(saved) and saved
    lines = {e.attrs["data-design"]: int(e.attrs["data-findings"]) for e in dom.inside("fuzz-findings")
             if "data-findings" in e.attrs}
    assert lines["jmp-slots"] == 0 and lines["linux-6.18"] > 0
    for record in saved:
        case = record.stem.rsplit("-c", 1)[1]
        marks = [e for e in dom.inside("fuzz-finding", design="linux-6.18", case=case) if "data-highlight" in e.attrs]
        assert [m.attrs["data-highlight"] for m in marks].count("violator") == 1
    # case 2 keeps one store (movdqu to rsp-16) whose value the trampoline's call overwrote
    highlights = [e.attrs["data-highlight"] for e in dom.inside("fuzz-finding", design="linux-6.18", case="2")
                  if "data-highlight" in e.attrs]
    assert sorted(highlights) == ["lost", "violator"]
