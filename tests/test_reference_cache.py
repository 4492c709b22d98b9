"""The scratch-CPU reference cache: a cached reference is the one a fresh scratch run gives."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emu.abi import RED_ZONE
from emu.cpu import STATE_X87_OFFSET, Cpu, RawState
from emu.cpu.effects import ReferenceCache, input_key, stored_into
from emu.cpu.scratch import ScratchCpu
from emu.cpu.state import RAW_KEPT, SLOTS, decode_state, encode_state
from emu.guestio import GuestIO
from emu.machine import Machine, RunOptions
from emu.verify.expected import expected_outcome, matches_exactly

TARGETS = str(Path(__file__).resolve().parent.parent / "elf_samples" / "probe_targets")
MXCSR_DEFAULT = 0x1F80
X87_DEFAULT = RawState(Cpu()).read()[STATE_X87_OFFSET:]  # a fresh CPU's x87 state, as the snapshot holds it

# (bytes, text): instructions a probe may sit on, reading registers, flags and memory
INSNS = [
    ("55", "push %rbp"),
    ("488b0424", "mov (%rsp),%rax"),
    ("4883c001", "add $1,%rax"),
    ("0f4fc1", "cmovg %ecx,%eax"),
    ("f30f6f0424", "movdqu (%rsp),%xmm0"),
    ("4889e5", "mov %rsp,%rbp"),
    ("c3", "ret"),
    ("488d0500100000", "lea 0x1000(%rip),%rax"),
]


@pytest.fixture(scope="module")
def guest() -> Machine:
    return Machine(TARGETS, [TARGETS], {}, RunOptions(design="int3"), GuestIO.captured())


@pytest.fixture
def code_address_on_stack(guest: Machine) -> Iterator[None]:
    """[rsp] holds a code address (a ``ret`` there returns somewhere mapped, as in a real program)."""
    saved = guest.mem.read(guest.entry_sp, 8)
    guest.mem.write(guest.entry_sp, guest.exe.entry.to_bytes(8, "little"))
    yield
    guest.mem.write(guest.entry_sp, saved)


def _raw(m: Machine, regs: dict[int, int], flags: int = 0x202) -> bytes:
    state = [0] * 18
    state[7], state[16], state[17] = m.entry_sp, m.exe.entry, flags
    for index, value in regs.items():
        state[index] = value
    return encode_state(state, (0, 0, bytes(range(256)), MXCSR_DEFAULT, X87_DEFAULT))


def _cache(m: Machine) -> ReferenceCache:
    return ReferenceCache(ScratchCpu(m.mem), RawState(m.cpu).mem)


@pytest.mark.parametrize("code", [c for c, _ in INSNS], ids=[t for _, t in INSNS])
@pytest.mark.usefixtures("code_address_on_stack")
def test_a_cached_reference_is_what_a_fresh_run_gives(guest: Machine, code: str) -> None:
    original = bytes.fromhex(code)
    cache = _cache(guest)
    first = cache.reference(guest.exe.entry, original, _raw(guest, {0: 5, 1: 0x1111, 6: 0xAAAA}))
    other = _raw(guest, {0: 5, 1: 0x2222, 6: 0xAAAA, 12: 77})  # rbx and r12: read by none of them
    again = cache.reference(guest.exe.entry, original, other)
    fresh = ScratchCpu(guest.mem).execute(guest.exe.entry, original, other)
    assert cache.runs == 1  # the second came from the cache
    assert (again.raw, again.stores, again.faulted) == (fresh.raw, fresh.stores, fresh.faulted)
    assert first.raw != again.raw or code in ("c3",)  # rbx differs in the result too (ret: rip only)


def test_a_changed_input_register_runs_again(guest: Machine) -> None:
    cache = _cache(guest)
    add = bytes.fromhex("4883c001")
    a = cache.reference(guest.exe.entry, add, _raw(guest, {0: 5}))
    b = cache.reference(guest.exe.entry, add, _raw(guest, {0: 6}))
    assert cache.runs == 2
    assert decode_state(a.raw)[0] == 6 and decode_state(b.raw)[0] == 7


def test_changed_flags_run_again(guest: Machine) -> None:
    cache = _cache(guest)
    cmovg = bytes.fromhex("0f4fc1")
    taken = cache.reference(guest.exe.entry, cmovg, _raw(guest, {0: 1, 2: 2}, flags=0x202))
    not_taken = cache.reference(guest.exe.entry, cmovg, _raw(guest, {0: 1, 2: 2}, flags=0x2C2))  # ZF: not greater
    assert cache.runs == 2
    assert decode_state(taken.raw)[0] == 2 and decode_state(not_taken.raw)[0] == 1


def test_memory_the_instruction_loaded_is_checked_at_each_use(guest: Machine) -> None:
    cache = _cache(guest)
    load = bytes.fromhex("488b0424")  # mov (%rsp),%rax
    raw = _raw(guest, {})
    sp = guest.entry_sp
    saved = guest.mem.read(sp, 8)
    try:
        guest.mem.write(sp, (0x1111).to_bytes(8, "little"))
        assert decode_state(cache.reference(guest.exe.entry, load, raw).raw)[0] == 0x1111
        assert decode_state(cache.reference(guest.exe.entry, load, raw).raw)[0] == 0x1111
        assert cache.runs == 1
        guest.mem.write(sp, (0x2222).to_bytes(8, "little"))
        assert decode_state(cache.reference(guest.exe.entry, load, raw).raw)[0] == 0x2222
        assert cache.runs == 2
    finally:
        guest.mem.write(sp, saved)


@pytest.mark.parametrize("code", ["0f31", "d9c0", "c5fc1109", "0f05"], ids=["rdtsc", "fld", "vmovups-from-ymm", "syscall"])
def test_instructions_whose_inputs_cannot_be_named_are_not_cached(code: str) -> None:
    assert input_key(bytes.fromhex(code), 0x1000) is None


def test_the_key_covers_what_capstone_says_is_read_plus_flags_and_bases() -> None:
    key = input_key(bytes.fromhex("55"), 0x1000)  # push %rbp: rsp, rbp
    assert key is not None
    raw = bytearray(448)
    for name in ("rsp", "rbp", "rflags", "fs_base", "gs_base", "mxcsr"):
        lo, hi = SLOTS[name]
        before = key(bytes(raw))
        raw[lo:hi] = b"\x01" * (hi - lo)
        assert key(bytes(raw)) != before, name
    before = key(bytes(raw))
    for name in ("rax", "rbx", "r12", "xmm3"):
        lo, hi = SLOTS[name]
        raw[lo:hi] = b"\x02" * (hi - lo)
    assert key(bytes(raw)) == before


@pytest.mark.usefixtures("code_address_on_stack")
@settings(max_examples=60, deadline=None)
@given(index=st.integers(0, len(INSNS) - 1), rax=st.integers(0, 2**64 - 1), rcx=st.integers(0, 2**64 - 1),
       other=st.integers(0, 2**64 - 1), flags=st.sampled_from([0x202, 0x2C2, 0x203, 0xA83]))
def test_cached_and_fresh_agree_on_random_states(guest: Machine, index: int, rax: int, rcx: int, other: int,
                                                 flags: int) -> None:
    original = bytes.fromhex(INSNS[index][0])
    cache = _cache(guest)
    cache.reference(guest.exe.entry, original, _raw(guest, {0: rax, 2: rcx, 1: other ^ 1}, flags))
    raw = _raw(guest, {0: rax, 2: rcx, 1: other}, flags)
    cached = cache.reference(guest.exe.entry, original, raw)
    fresh = ScratchCpu(guest.mem).execute(guest.exe.entry, original, raw)
    assert (cached.raw, cached.stores) == (fresh.raw, fresh.stores)


STORING = [("55", "push %rbp"), ("48894424f0", "mov %rax,-0x10(%rsp)"), ("f30f7f4424e0", "movdqu %xmm0,-0x20(%rsp)"),
           ("4883c001", "add $1,%rax")]
PERTURB = ["none", "register", "resume", "rsp", "redzone"]


@settings(max_examples=80, deadline=None)
@given(index=st.integers(0, len(STORING) - 1), rax=st.integers(0, 2**64 - 1), perturb=st.sampled_from(PERTURB),
       where=st.integers(0, 10**6), redzone=st.binary(min_size=RED_ZONE, max_size=RED_ZONE))
def test_settles_says_what_matches_exactly_says(guest: Machine, index: int, rax: int, perturb: str, where: int,
                                                redzone: bytes) -> None:
    """The cached hit's shortcut gives the verdict of the full comparison, for a hit that did what
    the reference did and for one that differs in one byte or address."""
    original = bytes.fromhex(STORING[index][0])
    cache = _cache(guest)
    start = _raw(guest, {0: rax})
    ref = cache.reference(guest.exe.entry, original, start)
    rsp, base = guest.entry_sp, guest.entry_sp - RED_ZONE
    end, end_addr, end_rsp = bytearray(ref.raw), int.from_bytes(ref.raw[:8], "little"), int.from_bytes(ref.raw[8:16], "little")
    after = bytearray(stored_into(redzone, base, ref.stores))
    if perturb == "register":
        end[RAW_KEPT + where % (len(end) - RAW_KEPT)] ^= 1 << where % 8
    elif perturb == "redzone":
        after[where % RED_ZONE] ^= 1 << where % 8
    end_addr += perturb == "resume"
    end_rsp -= 8 * (perturb == "rsp")
    tx = SimpleNamespace(site=guest.exe.entry, original=original, at=SimpleNamespace(original=original), start_raw=start,
                         start_rsp=rsp,
                         nop=False, chain=None, prepared=None, end_raw=bytes(end), end_addr=end_addr, end_rsp=end_rsp,
                         redzone_base=base, redzone_before=redzone, redzone_after=bytes(after))
    exact = matches_exactly(tx, expected_outcome(tx, cache))  # type: ignore[arg-type]
    effect = cache.prepare(guest.exe.entry, original, start).effect
    assert effect is not None and effect.settles(tx) == exact
    assert exact == (perturb == "none")
