"""benchmarks/real_programs.py times what it says: every mode of a command prints what the command
prints natively (a fast wrong answer is refused), and the ratios are the best times' ratios."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import benchmark_script, run_native

real_programs = benchmark_script("real_programs")

SHORT_LOOP = real_programs.Command("store_loop (no libc)", (real_programs.STORE_LOOP, "200000"))


def test_every_mode_runs_and_the_table_gives_the_ratios(tmp_path: Path) -> None:
    samples = real_programs.measure(SHORT_LOOP, 1, None, str(tmp_path))
    assert {"native", "run", "run --verify"} <= set(samples)
    assert all(len(times) == 1 and times[0] > 0 for times in samples.values())
    table = real_programs.table({SHORT_LOOP.name: samples}, None)
    ratio = min(samples["run --verify"]) / min(samples["run"])
    assert f"{ratio:.2f}x" in table.splitlines()[1]
    assert "geometric mean" in table


def test_a_mode_that_prints_something_else_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The negative control: the emulated run's output differs from native, so no time is taken."""
    wall = real_programs.wall

    def wrong_when_emulated(argv: list[str], env: dict[str, str]) -> tuple[float, bytes]:
        elapsed, out = wall(argv, env)
        return elapsed, out + b"!" if "emu" in argv else out

    monkeypatch.setattr(real_programs, "wall", wrong_when_emulated)
    with pytest.raises(RuntimeError, match="printed"):
        real_programs.measure(SHORT_LOOP, 1, None, str(tmp_path))


def test_an_unknown_command_name_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert real_programs.main(["--only", "no-such-command"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


bare_loader = benchmark_script("bare_loader")


@pytest.mark.parametrize("virtual_tlb", [False, True])
def test_bare_unicorn_runs_the_store_loop_in_either_tlb_mode(virtual_tlb: bool) -> None:
    """The engine's floor the README quotes: bare Unicorn, its TLB as the public API allows."""
    out: list[bytes] = []
    proc = bare_loader.BareProcess(real_programs.STORE_LOOP, [real_programs.STORE_LOOP, "100000"], [],
                                   out=lambda _fd, data: out.append(data))
    if virtual_tlb:
        proc.virtual_tlb()
    assert proc.run() == 0
    assert b"".join(out) == run_native([real_programs.STORE_LOOP, "100000"]).out
