"""The pytest plugin, run through pytester: the README example against redzone_probe under three designs."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parent.parent
REDZONE = REPO / "elf_samples" / "redzone_probe"

# The README example, verbatim but for the binary's path.
EXAMPLE = '''
import pytest

from emu.pytest_plugin import assert_no_violations

BINARY = "elf_samples/redzone_probe"


@pytest.mark.uprobe_designs("linux-6.18", "jmp-slots", "nop10")
def test_probes_keep_the_red_zone(uprobe_machine, kernel_design):
    run = uprobe_machine(BINARY, "3", design=kernel_design,
                         probes=["uprobe:rz_nop5_site", "usdt:redzone:site"])
    report = run.run()
    assert_no_violations(report)  # lists every violation: kind, probe, address, hit, evidence
    assert report.exit_status == 0, report.text
    assert report.hits["uprobe:rz_nop5_site"] == 3
'''


def _plugin_args(pytestconfig: pytest.Config) -> list[str]:
    """Load the plugin by module unless the installed entry point already did."""
    loaded = pytestconfig.pluginmanager.has_plugin("uprobe_emu") or pytestconfig.pluginmanager.has_plugin(
        "emu.pytest_plugin")
    return ["-p", "no:cacheprovider"] + ([] if loaded else ["-p", "emu.pytest_plugin"])


def test_readme_example_passes_on_safe_designs_and_names_the_red_zone_under_linux_618(
        pytester: pytest.Pytester, pytestconfig: pytest.Config) -> None:
    pytester.makepyfile(test_example=EXAMPLE.replace('"elf_samples/redzone_probe"', repr(str(REDZONE))))
    result = pytester.runpytest(*_plugin_args(pytestconfig), "-q")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines([
        "*test_probes_keep_the_red_zone?linux-6.18?*",
        "*uprobe violation(s) under linux-6.18 (redzone*",
        "*redzone: uprobe:rz_nop5_site at 0x40186f (hit 2)*",
    ])
    verbose = pytester.runpytest(*_plugin_args(pytestconfig), "-v")
    verbose.stdout.fnmatch_lines(["*[[]linux-6.18[]] FAILED*", "*[[]jmp-slots[]] PASSED*", "*[[]nop10[]] PASSED*"])


def test_kernel_design_covers_every_design_without_a_marker_and_honours_the_option(
        pytester: pytest.Pytester, pytestconfig: pytest.Config) -> None:
    pytester.makepyfile(test_designs='''
def test_design(kernel_design):
    assert kernel_design
''')
    from emu.designs import DESIGNS

    result = pytester.runpytest(*_plugin_args(pytestconfig), "-v")
    result.assert_outcomes(passed=len(DESIGNS))
    result.stdout.fnmatch_lines([f"*test_design[[]{d}[]] PASSED*" for d in DESIGNS])
    only = pytester.runpytest(*_plugin_args(pytestconfig), "-v", "--uprobe-designs=nop10,int3")
    only.assert_outcomes(passed=2)


def test_unknown_design_in_marker_is_a_usage_error(pytester: pytest.Pytester, pytestconfig: pytest.Config) -> None:
    pytester.makepyfile(test_bad='''
import pytest

@pytest.mark.uprobe_designs("linux-9.99")
def test_x(kernel_design):
    pass
''')
    result = pytester.runpytest(*_plugin_args(pytestconfig))
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*unknown uprobe design(s) linux-9.99*"])


def test_uprobe_check_and_assert_no_violations_on_a_design_report(
        pytester: pytest.Pytester, pytestconfig: pytest.Config) -> None:
    pytester.makepyfile(test_check=f'''
import pytest
from emu.pytest_plugin import assert_no_violations

@pytest.mark.uprobe_designs("int3", "linux-6.18")
def test_check(uprobe_check, kernel_design):
    report = uprobe_check({str(REDZONE)!r}, "2", probes=["uprobe:rz_nop5_site"])
    assert report.design == kernel_design
    assert_no_violations(report, same_output=True)
''')
    result = pytester.runpytest(*_plugin_args(pytestconfig), "-v")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*test_check[[]int3[]] PASSED*", "*under linux-6.18*", "*output differs*"])


def test_uprobe_check_raises_when_the_design_refuses_the_probe_asked_for(
        pytester: pytest.Pytester, pytestconfig: pytest.Config) -> None:
    """check's table keeps a refused probe as a row; a test that asked for it must not pass on 0 hits."""
    pytester.makepyfile(test_refused=f'''
import pytest
from emu.errors import ProbeRefused

def test_refused(uprobe_check):
    with pytest.raises(ProbeRefused, match="ENOTSUPP"):
        uprobe_check({str(REPO / "elf_samples" / "probe_targets")!r}, design="int3", probes=["uprobe:t_nop10"])
''')
    pytester.runpytest(*_plugin_args(pytestconfig)).assert_outcomes(passed=1)


def test_entry_point_is_declared() -> None:
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert meta["project"]["entry-points"]["pytest11"] == {"uprobe_emu": "emu.pytest_plugin"}
