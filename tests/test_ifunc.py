"""Probes in ifunc variants: which variant the emulated CPU makes glibc pick, and which the host's does."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import DEFAULT_ENV, REPO, sample

from emu.diff import run_diff
from emu.ifunc import IfuncProbe, Symbols, emulated_choices, host_choices, ifunc_probes, variant_family
from emu.native import available as native_available

CPU_STATE = sample("cpu_state")
ARGV = [CPU_STATE, "model"]


def test_glibc_ifuncs_of_a_static_binary_are_found() -> None:
    symbols = Symbols.read(CPU_STATE)
    families = {slot.ifunc for slot in symbols.slots}
    assert {"memcpy", "strlen", "memset"} <= families
    assert variant_family(symbols, ("__strlen_evex",), []) == "strlen"  # picked by neither run: named so
    assert variant_family(symbols, ("main",), []) is None
    assert Symbols.read(sample("hello_asm")).slots == ()  # no libc, no ifunc


def test_a_probe_outside_any_variant_gets_no_warning() -> None:
    assert ifunc_probes(CPU_STATE, ARGV, DEFAULT_ENV, ["uprobe:main", "uprobe:print_state"]) == []


@pytest.mark.skipif(not native_available("6.18"), reason="needs root, Linux 6.18 and the uprobe PMU")
def test_the_named_variants_are_the_ones_each_run_calls() -> None:
    """Each side's choice is checked by hit counts: the variant named for the host is hit natively and
    not emulated, the emulated one the other way round (when they differ)."""
    found = ifunc_probes(CPU_STATE, ARGV, DEFAULT_ENV, ["uprobe:__strlen_avx2", "uprobe:__memcpy_sse2_unaligned"])
    assert [p.ifunc for p in found] == ["strlen", "memcpy"]
    assert all(isinstance(p, IfuncProbe) and p.emulated and p.host for p in found)
    assert not any("avx" in (p.emulated or "") for p in found)  # the emulated CPU has no AVX
    specs = [f"uprobe:{p.emulated}" for p in found] + [f"uprobe:{p.host}" for p in found]
    report = run_diff(CPU_STATE, ARGV, specs, DEFAULT_ENV)
    n = len(found)
    for i, probe in enumerate(found):
        emulated_pick, host_pick = i, n + i
        assert report.hits[emulated_pick] > 0 and report.native.counts[host_pick] > 0, probe
        if probe.emulated != probe.host:
            assert report.native.counts[emulated_pick] == 0 and report.hits[host_pick] == 0, probe
    assert "the emulated CPU selects __strlen_sse2" in found[0].line()


@pytest.mark.skipif(not native_available("6.18"), reason="needs root, Linux 6.18 and the uprobe PMU")
def test_diff_warns_on_stderr() -> None:
    proc = subprocess.run([sys.executable, "-m", "emu", "diff", "-p", "uprobe:__strlen_avx2", CPU_STATE, "model"],
                          capture_output=True, text=True, cwd=REPO)
    assert "warning: uprobe:__strlen_avx2 is in __strlen_avx2, a variant of the ifunc strlen" in proc.stderr
    assert proc.returncode == 1 and proc.stdout.startswith("differ: ")


LIBC = os.path.realpath("/lib/x86_64-linux-gnu/libc.so.6")


@pytest.mark.skipif(not os.path.isfile(LIBC), reason=f"{LIBC} absent")
def test_a_stripped_libc_names_its_variants_by_address() -> None:
    """A dynamic executable: both runs stop at its entry (ld.so has run libc's resolvers by then)."""
    exe = os.path.realpath(sample("hello_dynamic"))
    files = {exe: Symbols.read(exe), LIBC: Symbols.read(LIBC)}
    emulated = emulated_choices(exe, [exe], DEFAULT_ENV, files)
    host = host_choices(exe, [exe], DEFAULT_ENV, files)
    assert emulated is not None and host is not None
    pick = emulated[LIBC]["strlen"][0]
    assert pick.startswith("0x")
    with open("/proc/cpuinfo") as fh:
        if " avx2" in fh.read():  # the emulated CPU has no AVX2: glibc must pick another strlen
            assert host[LIBC]["strlen"] != emulated[LIBC]["strlen"]
    found = ifunc_probes(exe, [exe], DEFAULT_ENV, [f"uprobe:{LIBC}:{pick}", f"uprobe:{LIBC}:0x1234"])
    assert [(p.ifunc, p.emulated, p.host) for p in found] == [("strlen", pick, host[LIBC]["strlen"][0])]
