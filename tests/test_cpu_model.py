"""One CPU model, told the same way by CPUID, the auxv, /proc/cpuinfo, /sys and the CPU count calls."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Sequence

import pytest
from conftest import DEFAULT_ENV, REPO, run_emulated, run_native, sample

from emu.cpu import unicorn_cpuid
from emu.cpumodel import (
    BY_NAME,
    FEATURES,
    LEAVES,
    UNICORN_CORRECTIONS,
    VARIABLE,
    CpuModel,
    R,
    advertised_unrunnable,
)
from emu.diff import run_diff
from emu.kernel.hostframe import host_frame
from emu.native import available as native_available

CPU_STATE = sample("cpu_state")


def test_every_advertised_instruction_runs_under_unicorn() -> None:
    assert advertised_unrunnable(CpuModel()) == []
    assert advertised_unrunnable(CpuModel(4)) == []


def test_advertising_avx_would_be_caught() -> None:
    leaves = dict(LEAVES)
    eax, ebx, ecx, edx = leaves[(1, 0)]
    leaves[(1, 0)] = (eax, ebx, ecx | 1 << BY_NAME["avx"].bit, edx)
    assert advertised_unrunnable(CpuModel(leaves=leaves)) == ["avx"]


def test_the_leaves_are_unicorns_own_but_for_the_named_corrections() -> None:
    queries = sorted(set(LEAVES) | set(UNICORN_CORRECTIONS))
    answers = dict(zip(queries, unicorn_cpuid(queries), strict=True))
    one = CpuModel(1)
    for query in queries:
        ours = one.cpuid(*query)
        want = UNICORN_CORRECTIONS.get(query, answers[query])
        assert want == answers[query], f"{query}: the correction list is stale"
        if query in UNICORN_CORRECTIONS:
            assert ours != want, f"{query}: corrected to what Unicorn already says"
        else:
            assert ours == want, f"{query}: ours {ours}, Unicorn {want}"


def test_the_cpu_count_shows_in_leaf_1_and_4_only() -> None:
    one, four = CpuModel(1), CpuModel(4)
    for query in LEAVES:
        a, b = one.cpuid(*query), four.cpuid(*query)
        changed = {R(i) for i in range(4) if a[i] != b[i]}
        assert changed <= set(VARIABLE.get(query, ())) | ({R.EDX} if query == (1, 0) else set()), query
    assert four.cpuid(1, 0)[R.EBX] >> 16 & 0xFF == 4 and four.has(BY_NAME["ht"]) and not one.has(BY_NAME["ht"])
    assert four.cpuid(4, 0)[R.EAX] >> 26 == 3


def test_every_set_bit_of_the_feature_leaves_has_a_name() -> None:
    model = CpuModel(2)
    named = {(f.leaf, f.subleaf, f.reg, f.bit) for f in FEATURES}
    for (leaf, subleaf), reg in (((1, 0), R.ECX), ((1, 0), R.EDX), ((7, 0), R.EBX), ((0x80000001, 0), R.ECX),
                                 ((0x80000001, 0), R.EDX), ((0xD, 1), R.EAX)):
        value = model.cpuid(leaf, subleaf)[reg]
        missing = [bit for bit in range(32) if value >> bit & 1 and (leaf, subleaf, reg, bit) not in named]
        assert missing == [], (hex(leaf), reg, missing)


def _parse(out: bytes) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in out.decode().splitlines())


def _consistent(report: dict[str, str], flags_known_only: bool) -> int:
    """The relations Linux keeps between the channels; returns the CPU count they agree on."""
    words = {key[len("cpuid "):]: [int(w, 16) for w in value.split()] for key, value in report.items()
             if key.startswith("cpuid ")}
    assert int(report["auxv 16"], 16) == words["0x1.0"][R.EDX]  # AT_HWCAP is CPUID(1).edx
    fsgsbase = words["0x7.0"][R.EBX] & 1
    assert int(report["auxv 26"], 16) & 2 == 2 * fsgsbase
    assert report["auxv 15"] == "x86_64"
    shown = set(report["cpuinfo flags\t\t"].split())
    for feature in FEATURES:
        word = words.get(f"{feature.leaf:#x}.{feature.subleaf}")
        if word is None or not feature.shown:
            continue
        has = bool(word[feature.reg] >> feature.bit & 1)
        if flags_known_only and has and feature.name not in shown:
            continue  # the host's kernel hides features it does not use or trust (rdseed on AMD Zen 5 in
            # Linux 6.18); it never shows one the CPU lacks
        assert (feature.name in shown) == has, feature.name
    counts = {report[k] for k in ("affinity", "onln", "conf", "nprocs", "nprocs_conf", "cpuinfo processors")}
    assert len(counts) == 1, report
    return int(counts.pop())


def test_native_channels_keep_the_relations_the_test_checks() -> None:
    """The check below, on the host: AT_HWCAP is CPUID(1).edx, the counts agree (a control for the relations)."""
    native = run_native([CPU_STATE, "model"])
    assert native.status == 0
    _consistent(_parse(native.out), flags_known_only=True)


@pytest.mark.parametrize("cpus", [1, 3])
def test_emulated_channels_tell_one_model(cpus: int) -> None:
    out = run_emulated([CPU_STATE, "model"], cpus=cpus)
    assert out.status == 0, out.err
    report = _parse(out.out)
    assert _consistent(report, flags_known_only=False) == cpus
    assert report["online"] == ("0" if cpus == 1 else f"0-{cpus - 1}")
    assert report["xcr0"] == "0x3" and report["cpuid 0xd.0"].split()[1] == "00000240"
    assert report["cpuinfo model name\t"] == CpuModel().model_name
    assert int(report["auxv 51"], 16) == host_frame().minsigstksz  # AT_MINSIGSTKSZ: the frames are the host's


def test_a_flawed_report_fails_the_consistency_check() -> None:
    out = run_emulated([CPU_STATE, "model"], cpus=2)
    report = _parse(out.out)
    report["auxv 16"] = "0x178bfbff"  # the host's AT_HWCAP, as the emulator once copied it
    with pytest.raises(AssertionError):
        _consistent(report, flags_known_only=False)
    report = _parse(out.out)
    report["onln"] = "1"
    with pytest.raises(AssertionError):
        _consistent(report, flags_known_only=False)


@pytest.mark.parametrize("bad", ["0", "257", "two", "-1"])
def test_bad_cpu_count_is_a_one_line_usage_error(bad: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "emu", "run", "--cpus", bad, "/bin/true"],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2
    assert re.fullmatch(r"uprobe-emu: argument --cpus: .*\n", proc.stderr), proc.stderr


def test_sys_lists_the_cpus_there_are_and_no_more() -> None:
    listing = run_emulated(["/bin/ls", "/sys/devices/system/cpu", "/sys/devices/system/cpu/cpu1"], cpus=2)
    assert listing.status == 0
    assert listing.out.decode().split() == [
        "/sys/devices/system/cpu:", "cpu0", "cpu1", "isolated", "kernel_max", "offline", "online", "possible",
        "present", "/sys/devices/system/cpu/cpu1:", "online"]
    for path in ("/sys/devices/system/cpu/cpu2", "/sys/devices/system/cpu/cpu0/online", "/sys/devices/system/cpu/cpufreq"):
        missing = run_emulated(["/bin/cat", path], cpus=2)
        assert missing.status == 1 and b"No such file or directory" in missing.err, path
    assert run_emulated(["/bin/cat", "/sys/devices/system/cpu/cpu1/online"], cpus=2).out == b"1\n"


def test_status_tells_the_affinity() -> None:
    out = run_emulated(["/bin/grep", "Cpus_allowed", "/proc/self/status"], cpus=40).out
    assert out == b"Cpus_allowed:\tff,ffffffff\nCpus_allowed_list:\t0-39\n"
    assert CpuModel(1).affinity_hex() == "1" and CpuModel(2).affinity_hex() == "3"


def _advertised_but_not_running(rows: Sequence[tuple[str, ...]]) -> list[str]:
    return [row[0] for row in rows[1:] if row[1] == "yes" and row[2] == "no"]


def test_cpu_info_lists_the_model_next_to_the_host() -> None:
    proc = subprocess.run([sys.executable, "-m", "emu", "run", "--cpus", "2", "--cpu-info"], capture_output=True,
                          text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"emulated: {CpuModel().model_name} (GenuineIntel, family 6 model 60), 2 CPUs")
    assert f"AT_HWCAP {CpuModel(2).hwcap:#x}" in lines[2]
    rows = [tuple(line.split()) for line in lines[3:] if len(line.split()) == 4]
    table = {row[0]: row[1:] for row in rows}
    assert table["sse4_2"][:2] == ("yes", "yes") and table["avx"][:2] == ("no", "no")
    assert len(rows) == len(FEATURES)
    assert _advertised_but_not_running([("feature", "emulated", "runs here", "host"), *rows]) == []


def test_cpu_info_rows_would_show_an_unrunnable_feature() -> None:
    from emu.cpumodel import feature_rows

    leaves = dict(LEAVES)
    eax, ebx, ecx, edx = leaves[(7, 0)]
    leaves[(7, 0)] = (eax, ebx | 1 << BY_NAME["avx2"].bit, ecx, edx)
    runs = {f.name: f.name != "avx2" for f in FEATURES}
    rows = feature_rows(CpuModel(leaves=leaves), runs, [])
    assert _advertised_but_not_running(rows) == ["avx2"]


@pytest.mark.skipif(not native_available("6.18"), reason="needs root, Linux 6.18 and the uprobe PMU")
def test_diff_with_the_hosts_cpu_count_agrees_on_nproc() -> None:
    host = len(os.sched_getaffinity(0))
    assert run_diff("/usr/bin/nproc", ["nproc"], [], DEFAULT_ENV, cpus=host).first_difference() is None
    other = run_diff("/usr/bin/nproc", ["nproc"], [], DEFAULT_ENV, cpus=host + 1).first_difference()
    assert other == f"stdout line 1: native b'{host}', emulated b'{host + 1}'"


def test_proc_stat_has_a_line_a_cpu() -> None:
    out = run_emulated(["/bin/grep", "-c", "^cpu[0-9]", "/proc/stat"], cpus=5).out
    assert out == b"5\n"


def test_sched_setaffinity_narrows_what_the_process_is_told() -> None:
    out = run_emulated(["/usr/bin/taskset", "-c", "1,3", "/bin/grep", "Cpus_allowed_list", "/proc/self/status"], cpus=4)
    assert out.out == b"Cpus_allowed_list:\t1,3\n"
    assert run_emulated(["/usr/bin/taskset", "-c", "1,3", "/usr/bin/nproc"], cpus=4).out == b"2\n"
    assert CpuModel(8).cpu_list(0b10110111) == "0-2,4-5,7"


def test_an_affinity_with_no_existing_cpu_fails_as_natively() -> None:
    host = len(os.sched_getaffinity(0))
    argv = ["/usr/bin/taskset", "-c", str(host + 3), "/usr/bin/nproc"]
    native, emulated = run_native(argv), run_emulated(argv, cpus=host)
    assert native.status == 1 and b"Invalid argument" in native.err
    pid = re.compile(rb"pid \d+")
    assert (emulated.status, pid.sub(b"pid N", emulated.err)) == (native.status, pid.sub(b"pid N", native.err))
