"""Mutated ELFs through run, scan and check: every one ends in exit 2 with one line on stderr, or in
a guest ending the kernel models (an exit status, or a signal as 128+N); never a traceback or a hang.

The seed is a tiny PIE made here byte by byte, so that every part the issue names is present and a
run costs microseconds: ELF header, four program headers (PT_LOAD, PT_DYNAMIC, PT_NOTE,
PT_GNU_STACK), a dynamic section and a GNU ABI-tag note. Mutations hit their fields with values
chosen to overflow (entry points past 2^64 once biased, sizes past the file, counts past the
table), plus random bytes and truncation. Commands run in-process through the CLI entry point.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emu.cli import main
from emu.errors import EXIT_HARNESS_ERROR

PT_LOAD, PT_DYNAMIC, PT_NOTE, PT_GNU_STACK = 1, 2, 4, 0x6474E551
EHDR, PHENT, PHNUM = 64, 56, 4
CODE_AT = EHDR + PHENT * PHNUM  # 288
# write(1, "hi\n", 3); exit_group(0); hlt  -- "hi\n" follows the code (lea rip+17)
CODE = bytes.fromhex("b801000000" "bf01000000" "488d3511000000" "ba03000000" "0f05" "b8e7000000" "31ff" "0f05" "f4")
MSG = b"hi\n"
DYN_AT = (CODE_AT + len(CODE) + len(MSG) + 7) & ~7
DYNAMIC = struct.pack("<6Q", 0x6FFFFFFB, 0x08000000, 21, 0, 0, 0)  # DT_FLAGS_1 = DF_1_PIE, DT_DEBUG, DT_NULL
NOTE_AT = DYN_AT + len(DYNAMIC)
NOTE = struct.pack("<III4sIIII", 4, 16, 1, b"GNU\0", 0, 3, 2, 0)  # NT_GNU_ABI_TAG: Linux 3.2.0
SIZE = NOTE_AT + len(NOTE)


def tiny_pie() -> bytes:
    ehdr = struct.pack("<4sBBBBB7xHHIQQQIHHHHHH", b"\x7fELF", 2, 1, 1, 0, 0, 3, 62, 1, CODE_AT, EHDR, 0, 0,
                       EHDR, PHENT, PHNUM, 64, 0, 0)
    phdrs = b"".join(struct.pack("<IIQQQQQQ", *p) for p in (
        (PT_LOAD, 5, 0, 0, 0, SIZE, SIZE, 0x1000),
        (PT_DYNAMIC, 6, DYN_AT, DYN_AT, DYN_AT, len(DYNAMIC), len(DYNAMIC), 8),
        (PT_NOTE, 4, NOTE_AT, NOTE_AT, NOTE_AT, len(NOTE), len(NOTE), 4),
        (PT_GNU_STACK, 6, 0, 0, 0, 0, 0, 16),
    ))
    body = CODE + MSG
    return ehdr + phdrs + body + bytes(DYN_AT - CODE_AT - len(body)) + DYNAMIC + NOTE


SEED = tiny_pie()
EHDR_FIELDS = [(16, "<H"), (18, "<H"), (20, "<I"), (24, "<Q"), (32, "<Q"), (40, "<Q"), (52, "<H"), (54, "<H"),
               (56, "<H"), (58, "<H"), (60, "<H"), (62, "<H")]
PHDR_FIELDS = [(0, "<I"), (4, "<I"), (8, "<Q"), (16, "<Q"), (24, "<Q"), (32, "<Q"), (40, "<Q"), (48, "<Q")]
DYN_FIELDS = [(DYN_AT + 8 * i, "<Q") for i in range(len(DYNAMIC) // 8)]
NOTE_FIELDS = [(NOTE_AT, "<I"), (NOTE_AT + 4, "<I"), (NOTE_AT + 8, "<I"), (NOTE_AT + 12, "<I")]
SPECIAL = [0, 1, 3, 7, 8, 0x38, 0x40, 0xFFF, 0x1000, 0x1001, SIZE, SIZE + 1, 0x400000, 0x7FFFFFFFF000,
           1 << 47, 1 << 63, (1 << 64) - 1, (1 << 64) - 0x1000, 0x6474E551, 0x6FFFFFFB, 0x7FFFFFFF, 0xFFFFFFFF]
REGIONS = [(0, EHDR), (EHDR, CODE_AT), (CODE_AT, DYN_AT), (DYN_AT, SIZE), (0, SIZE)]


def _value(fmt: str) -> st.SearchStrategy[int]:
    bits = struct.calcsize(fmt) * 8
    return st.one_of(st.sampled_from([v for v in SPECIAL if v < 1 << bits]), st.integers(0, (1 << bits) - 1))


@st.composite
def mutants(draw: st.DrawFn) -> bytes:
    data = bytearray(SEED)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["byte", "ehdr", "phdr", "phdr", "dynamic", "note", "truncate"]))
        if kind == "byte":
            lo, hi = draw(st.sampled_from(REGIONS))
            at = draw(st.integers(lo, hi - 1))
            if at < len(data):
                data[at] = draw(st.integers(0, 255))
            continue
        if kind == "truncate":
            del data[draw(st.integers(0, len(data))):]
            continue
        if kind == "phdr":
            field, fmt = draw(st.sampled_from(PHDR_FIELDS))
            offset = EHDR + PHENT * draw(st.integers(0, PHNUM - 1)) + field
        else:
            offset, fmt = draw(st.sampled_from({"ehdr": EHDR_FIELDS, "dynamic": DYN_FIELDS, "note": NOTE_FIELDS}[kind]))
        if offset + struct.calcsize(fmt) <= len(data):
            struct.pack_into(fmt, data, offset, draw(_value(fmt)))
    return bytes(data)


def _command(capfd: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    status = main(list(argv))
    return status, capfd.readouterr().err


def _ends_cleanly(status: int, err: str, guest: bool) -> None:
    """Exit 2 with one line naming the tool; a guest run may also end with its own status or signal."""
    assert "Traceback" not in err
    if status == EXIT_HARNESS_ERROR and err.startswith("uprobe-emu: ") and err.count("\n") == 1:
        return
    assert guest, f"status {status}, stderr {err!r}"
    assert -64 <= status <= 255
    if status < 0:
        assert not err  # a modelled death by signal -status: the tool dies of it too, silently as natively


def test_the_seed_is_a_working_pie(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tiny"
    path.write_bytes(SEED)
    path.chmod(0o755)
    assert _command(capfd, "run", str(path)) == (0, "")
    assert struct.unpack_from("<H", SEED, 16)[0] == 3  # ET_DYN
    path.write_bytes(SEED[:100])  # a negative control: a clearly broken file gives the one-line error
    status, err = _command(capfd, "run", str(path))
    assert status == EXIT_HARNESS_ERROR and err.count("\n") == 1


def test_an_entry_point_that_overflows_when_biased_is_a_modelled_ending(tmp_path: Path,
                                                                          capfd: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "entry"
    data = bytearray(SEED)
    struct.pack_into("<Q", data, 24, (1 << 64) - 1)
    path.write_bytes(bytes(data))
    path.chmod(0o755)
    status, err = _command(capfd, "run", str(path))
    _ends_cleanly(status, err, guest=True)
    assert status == -11  # the sum wraps, as the kernel's does, to an unmapped address: SIGSEGV


@pytest.fixture(scope="module")
def mutant_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pie-mutants") / "mutant"


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(data=mutants())
def test_mutated_pies_through_run_scan_and_check(mutant_path: Path, capfd: pytest.CaptureFixture[str],
                                                 data: bytes) -> None:
    mutant_path.write_bytes(data)
    mutant_path.chmod(0o755)
    path = str(mutant_path)
    status, err = _command(capfd, "run", "--max-insns", "20000", "--timeout", "2", path)
    _ends_cleanly(status, err, guest=True)
    status, err = _command(capfd, "scan", path)
    _ends_cleanly(status, err, guest=status == 0)
    status, err = _command(capfd, "check", "--max-insns", "20000", "--timeout", "2", path)
    _ends_cleanly(status, err, guest=status in (0, 1))
