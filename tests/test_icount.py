"""Instruction counting per translated block (emu/process/icount.py), in C and in Python: exact totals on
programs of known length, --max-insns exact at and inside a block, counts that follow changed code."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import built_extension

from emu import hotpath
from emu.abi import Prot
from emu.cpu import Cpu, Reg
from emu.fuzz.elfwriter import write_elf
from emu.guestio import GuestIO
from emu.machine import Ending, Machine, RunOptions
from emu.process.icount import NativeCounter, PythonCounter, make_counter

SAMPLES = Path(__file__).resolve().parent.parent / "elf_samples"
LOOPS = 50


EXTENSION = built_extension("icount_block")


needs_extension = pytest.mark.skipif(EXTENSION is None, reason="the C extension is not built on this host "
                                                                  "(no compiler at install)")


@pytest.fixture(params=["python", pytest.param("native", marks=needs_extension)])
def impl(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Each test runs with each implementation, whichever one the environment would pick."""
    if request.param == "native":
        monkeypatch.setattr(hotpath, "native", EXTENSION)
    else:
        monkeypatch.setattr(hotpath, "native", None)
    yield request.param


def loop_code(n: int) -> bytes:
    """mov rcx, n | 1: dec rcx; jnz 1b | mov eax, 231; xor edi, edi; syscall: 2n + 4 instructions in
    blocks of 3 (mov, dec, jnz), then 2 (dec, jnz) n - 1 times, then 3 (the exit)."""
    return (b"\x48\xc7\xc1" + struct.pack("<i", n) + b"\x48\xff\xc9\x75\xfb"
            + b"\xb8\xe7\x00\x00\x00\x31\xff\x0f\x05")


@pytest.fixture(scope="module")
def loop(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("icount") / "loop")
    write_elf(path, loop_code(LOOPS), b"")
    return path


def _run(path: str, argv: list[str] | None = None, **options: object) -> Machine:
    machine = Machine(path, argv or [path], {}, RunOptions(**options), GuestIO.captured())  # type: ignore[arg-type]
    machine.result = machine.run()  # type: ignore[attr-defined]
    return machine


def test_the_environment_picks_the_implementation(impl: str) -> None:
    counter = make_counter(Cpu(), None)
    assert isinstance(counter, NativeCounter if impl == "native" else PythonCounter)


def test_a_program_of_known_length(impl: str, loop: str) -> None:
    machine = _run(loop, count_insns=True)
    assert machine.result.ending is Ending.EXITED  # type: ignore[attr-defined]
    assert machine.result.insns == 2 * LOOPS + 4  # type: ignore[attr-defined]


def test_hello_asm_counts_its_eight_instructions(impl: str) -> None:
    assert _run(str(SAMPLES / "hello_asm"), count_insns=True).result.insns == 8  # type: ignore[attr-defined]


@pytest.mark.parametrize("limit, rcx, at_jnz", [
    (3, LOOPS - 1, False),  # the end of the first block (mov, dec, jnz)
    (5, LOOPS - 2, False),  # a block boundary inside the loop
    (4, LOOPS - 2, True),  # inside a block: the dec ran, the jnz did not
    (2 * LOOPS, 0, True),  # inside the last loop block
    (1, LOOPS, False),  # inside the very first block: only the mov
])
def test_max_insns_stops_exactly(impl: str, loop: str, limit: int, rcx: int, at_jnz: bool) -> None:
    machine = _run(loop, max_insns=limit)
    result = machine.result  # type: ignore[attr-defined]
    assert result.ending is Ending.INSN_LIMIT and result.insns == limit
    assert result.message == f"stopped after {limit} instructions (--max-insns {limit})"
    # the machine state says how many instructions really ran, whatever the counter claims
    assert machine.cpu.read(Reg.RCX) == rcx
    loop_start = machine.exe.entry + 7
    assert machine.cpu.read(Reg.RIP) == loop_start + (3 if at_jnz else 0)


def test_a_limit_past_the_end_does_not_stop_the_program(impl: str, loop: str) -> None:
    result = _run(loop, max_insns=2 * LOOPS + 4).result  # type: ignore[attr-defined]
    assert result.ending is Ending.EXITED and result.insns == 2 * LOOPS + 4
    result = _run(loop, max_insns=2 * LOOPS + 3).result  # type: ignore[attr-defined]
    assert result.ending is Ending.INSN_LIMIT and result.insns == 2 * LOOPS + 3  # (negative control)


@needs_extension
def test_both_implementations_count_a_libc_program_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(SAMPLES / "cpu_bound")
    totals = []
    for native in (None, EXTENSION):
        monkeypatch.setattr(hotpath, "native", native)
        totals.append(_run(path, [path, "2000"], count_insns=True).result.insns)  # type: ignore[attr-defined]
    assert totals[0] == totals[1] and totals[0] > 20_000


# ---------------------------------------------------------------- code that changes
CODE = 0x10000
RWX = Prot.READ | Prot.WRITE | Prot.EXEC
FIVE_NOPS, ONE_NOP5 = b"\x90" * 5, b"\x0f\x1f\x44\x00\x00"  # the same 5 bytes: 5 instructions, or 1


def _counter(impl: str, cpu: Cpu, track: bool) -> NativeCounter | PythonCounter:
    return (NativeCounter if impl == "native" else PythonCounter)(cpu, None, track_translations=track)


@pytest.mark.parametrize("track", [True, False])
def test_a_patched_block_is_counted_as_it_now_is(impl: str, track: bool) -> None:
    """The harness patches a block (a probe site) and flushes its translation: the next run counts the
    new instructions. Without the translation hook (the negative control) the old count would stay."""
    cpu = Cpu()
    cpu.mem_map(CODE, 0x1000, RWX)
    cpu.mem_write(CODE, FIVE_NOPS + b"\xf4")  # nop x5; hlt
    counter = _counter(impl, cpu, track)
    counter.run(CODE)  # (the hlt faults at CPL 3: the run ends there)
    assert counter.total == 6
    cpu.mem_write(CODE, ONE_NOP5)
    cpu.flush_code(CODE, CODE + 6)
    counter.run(CODE)
    assert counter.total - 6 == (2 if track else 6)


@pytest.mark.parametrize("track", [True, False])
def test_self_modifying_code_is_counted_as_it_now_is(impl: str, track: bool) -> None:
    """The guest rewrites a block it ran before, with no flush from the harness (Unicorn sees the store
    and translates again)."""
    target = CODE + 0x1000
    cpu = Cpu()
    cpu.mem_map(CODE, 0x2000, RWX)
    cpu.mem_write(target, ONE_NOP5 + b"\xf4")  # nop5; hlt: 2 instructions
    # mov dword [target], 0x90909090; mov byte [target + 4], 0x90; jmp target: 3 instructions
    writer = (b"\xc7\x04\x25" + struct.pack("<II", target, 0x90909090)
              + b"\xc6\x04\x25" + struct.pack("<I", target + 4) + b"\x90")
    writer += b"\xe9" + struct.pack("<i", target - (CODE + len(writer) + 5))
    cpu.mem_write(CODE, writer)
    counter = _counter(impl, cpu, track)
    counter.run(target)
    assert counter.total == 2
    counter.run(CODE)
    assert cpu.mem_read(target, 5) == FIVE_NOPS
    assert counter.total - 2 == (3 + 6 if track else 3 + 2)


@needs_extension
def test_blocks_pushed_out_of_a_small_table_are_counted_from_their_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hotpath, "native", EXTENSION)
    path = str(SAMPLES / "cpu_bound")
    full = _run(path, [path, "300"], count_insns=True)
    monkeypatch.setattr("emu.process.icount.TABLE_BUCKETS_LOG2", 1)  # 4 entries: most blocks get pushed out
    monkeypatch.setattr("emu.process.icount.FRONT_LOG2", 1)  # and 2 in front of them
    small = _run(path, [path, "300"], count_insns=True)
    assert isinstance(small.counter, NativeCounter) and isinstance(full.counter, NativeCounter)
    assert small.counter.decoded > 100 * max(full.counter.decoded, 1)
    assert small.result.insns == full.result.insns  # type: ignore[attr-defined]


def test_a_fault_inside_the_last_block_ends_the_count_where_it_happened(impl: str, tmp_path: Path) -> None:
    # mov eax, 1; mov ecx, 2; mov [0], eax (faults); nop; nop; exit_group(0): one block of 8
    path = str(tmp_path / "fault")
    write_elf(path, b"\xb8\x01\x00\x00\x00\xb9\x02\x00\x00\x00\x89\x04\x25\x00\x00\x00\x00\x90\x90"
              b"\xb8\xe7\x00\x00\x00\x31\xff\x0f\x05", b"")
    limited = _run(path, max_insns=5).result  # type: ignore[attr-defined]
    assert limited.ending is Ending.KILLED and limited.insns == 2  # the two movs ran, the store did not
    assert _run(path, max_insns=2).result.ending is Ending.INSN_LIMIT  # type: ignore[attr-defined]
    # without a limit inside it, the block counts whole (as any block counter does)
    assert _run(path, count_insns=True).result.insns == 8  # type: ignore[attr-defined]
