"""Page permissions after the TLB has seen a page: each guest page enters Unicorn's TLB with its
mapping's permissions (emu/cpu/pages.py), and every change of a mapping keeps the TLB and the
translated code right: faults with Linux's si_code and si_addr, JIT code rewritten under W^X or in
place, a page that becomes executable later or stops being so."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import built_extension, run_emulated, run_native
from hypothesis import given, settings
from hypothesis import strategies as st

from emu import hotpath
from emu.abi import PAGE_SIZE, Prot
from emu.asm import assemble
from emu.cpu import BadAccess, Cpu, Reg, StopReason
from emu.cpu.pages import PageTable
from emu.guestio import GuestIO
from emu.machine import Machine, RunOptions

EXTENSION = built_extension("tlbfill_hook")
needs_extension = pytest.mark.skipif(EXTENSION is None, reason="the C extension is not built")
PAGE_PERMS = str(Path(__file__).resolve().parent.parent / "elf_samples" / "page_perms")
SEGV_ACCERR = "  signal=11 code=2 addr=expected\n"
EXPECTED = {
    "ro-after-write": "ro-after-write: read back 2\n" + SEGV_ACCERR,
    "none-after-read": "none-after-read: 42\n" + SEGV_ACCERR,
    "unmapped-after-use": "unmapped-after-use: 7\n  signal=11 code=1 addr=expected\n",  # SEGV_MAPERR
    "nx-call": "nx-call:\n" + SEGV_ACCERR,  # si_addr: the call's target
    "jit-wx": "jit-wx: 10 20 30\n",
    "jit-rwx": "jit-rwx: 1 2 3\n",
    "exec-later": "exec-later: 4 8\n",
    "nx-later": "nx-later: 6\n" + SEGV_ACCERR,
    "fix-and-retry": "fix-and-retry:\n" + SEGV_ACCERR + "  no fault\n  stored 11 after 1 fault(s)\n",
    "fault-twice": "fault-twice:\n" + SEGV_ACCERR * 2 + "  2 faults\n",
}


def emulated(*cases: str) -> tuple[int, str]:
    io = GuestIO.captured()
    result = Machine(PAGE_PERMS, [PAGE_PERMS, *cases], {}, RunOptions(), io).run()
    return result.exit_status, io.out.decode()


@pytest.mark.parametrize("case", list(EXPECTED))
def test_native_prints_the_expected_lines(case: str) -> None:
    native = subprocess.run([PAGE_PERMS, case], capture_output=True, text=True, env={}, timeout=30)
    assert (native.returncode, native.stdout) == (0, EXPECTED[case])


@pytest.mark.parametrize("case", list(EXPECTED))
def test_emulated_prints_what_linux_does(case: str) -> None:
    assert emulated(case) == (0, EXPECTED[case])


def test_all_cases_in_one_process() -> None:
    """One address space through every change in turn: no TLB entry of one case outlives its mapping."""
    status, out = emulated(*EXPECTED)
    assert status == 0
    assert out == "".join(EXPECTED.values())


# ---------------------------------------------------------------- the table itself
@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 31), st.integers(1, 8), st.sampled_from([None, 0, 1, 3, 5, 7])),
                max_size=25))
def test_the_table_answers_as_a_page_by_page_model(changes: list[tuple[int, int, int | None]]) -> None:
    """Ranges split, merge and vanish as mmap, mprotect and munmap of pages would leave them."""
    table = PageTable(None, 0)
    model: dict[int, int] = {}
    for first, count, perms in changes:
        table.set(first * PAGE_SIZE, (first + count) * PAGE_SIZE, perms)
        for page in range(first, first + count):
            if perms is None:
                model.pop(page, None)
            else:
                model[page] = perms
    for page in range(40):
        assert table.perms_at(page * PAGE_SIZE + 123) == model.get(page, 0)
    ranges = table.ranges()
    assert all(a[1] <= b[0] for a, b in zip(ranges, ranges[1:], strict=False))  # sorted, disjoint
    assert all(not (a[1] == b[0] and a[2] == b[2]) for a, b in zip(ranges, ranges[1:], strict=False))  # merged


def test_a_table_past_its_first_capacity_still_answers() -> None:
    table = PageTable(None, 0)
    for page in range(0, 2000, 2):  # 1,000 separate ranges
        table.set(page * PAGE_SIZE, (page + 1) * PAGE_SIZE, 1 + page % 7)
    assert [table.perms_at(page * PAGE_SIZE) for page in (0, 1, 998, 1998, 1999)] == [1, 0, 1 + 998 % 7, 1 + 1998 % 7, 0]


# ------------------------------------------------------ the TLB, on a bare CPU
CODE, DATA, SWEEP = 0x400000, 0x600000, 0x1000000


def _bare(code: bytes) -> Cpu:
    cpu = Cpu()
    cpu.mem_map(CODE, PAGE_SIZE, Prot.READ | Prot.EXEC)
    cpu.mem_write(CODE, code + b"\xf4")  # hlt: #GP at CPL 3, which stops the run
    cpu.mem_map(DATA, PAGE_SIZE, Prot.READ | Prot.WRITE)
    cpu.hooks.add_interrupt(lambda _intno: cpu.stop())
    return cpu


def test_data_pages_enter_the_tlb_without_exec() -> None:
    cpu = _bare(bytes.fromhex("48c7042500006000" "2a000000"))  # mov qword [0x600000], 42
    assert cpu.run(CODE) is StopReason.FINISHED
    assert cpu.mem_read(DATA, 8) == (42).to_bytes(8, "little")
    assert cpu.pages.perms_at(DATA) == Prot.READ | Prot.WRITE and cpu.pages.fills >= 2  # the code page and the data page


def test_a_fault_arms_a_hook_over_its_page_only_until_the_run_returns() -> None:
    cpu = _bare(bytes.fromhex("48c7042500107000" "2a000000"))  # mov qword [0x701000], 42: unmapped
    assert cpu.run(CODE) is StopReason.BAD_ACCESS
    bad = cpu.last_bad_access
    assert bad is not None and (bad.address, bad.unmapped) == (0x701000, True)
    assert cpu.pages.armed() == []  # removed as the run returned


def test_a_fault_mapped_in_by_the_handler_disarms_its_page_at_once() -> None:
    cpu = _bare(bytes.fromhex("48c7042500107000" "2a000000"))
    armed_during: list[list[int]] = []

    def map_it(_bad: BadAccess) -> bool:
        cpu.mem_map(0x701000, PAGE_SIZE, Prot.READ | Prot.WRITE)
        armed_during.append(cpu.pages.armed())
        return True

    cpu.on_unmapped = map_it
    assert cpu.run(CODE) is StopReason.FINISHED
    assert armed_during == [[0x701000]]
    assert cpu.mem_read(0x701000, 8) == (42).to_bytes(8, "little")
    assert cpu.read(Reg.RIP) > CODE


def _sweep(pages: int, rounds: int) -> Cpu:
    """A bare CPU that reads one word of each of ``pages`` data pages in turn, ``rounds`` times."""
    code = assemble(f"""
        mov ${rounds}, %rcx
    outer:
        mov ${SWEEP}, %rax
        mov ${pages}, %rdx
    inner:
        mov (%rax), %rbx
        add ${PAGE_SIZE}, %rax
        dec %rdx
        jnz inner
        dec %rcx
        jnz outer
    """, CODE)
    cpu = _bare(code)
    cpu.mem_map(SWEEP, pages * PAGE_SIZE, Prot.READ | Prot.WRITE)
    return cpu


@pytest.mark.parametrize("native", [False, pytest.param(True, marks=needs_extension)])
def test_misses_that_go_on_let_the_tlb_grow(native: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """1,024 pages read in turn miss a 256-entry TLB on every read; flushes let Unicorn make it larger,
    after which a round misses nothing. Without them (the negative control) every read misses."""
    monkeypatch.setattr(hotpath, "native", EXTENSION if native else None)
    rounds, pages = 40, 1024
    grown = _sweep(pages, rounds)
    assert grown.run(CODE) is StopReason.FINISHED
    monkeypatch.setattr("emu.cpu.pages.GROW_STEP_FIRST", 0)
    fixed = _sweep(pages, rounds)
    assert fixed.run(CODE) is StopReason.FINISHED
    assert fixed.pages.growths == 0 and fixed.pages.fills >= rounds * pages
    assert 1 <= grown.pages.growths <= 9 and grown.pages.fills < fixed.pages.fills // 4


HELLO_DYNAMIC = str(Path(__file__).resolve().parent.parent / "elf_samples" / "hello_dynamic")


def test_a_program_that_never_faults_arms_no_hook() -> None:
    """ld.so's mprotect splits mappings, and Unicorn then fills the TLB for a fetch of each piece it
    drops code from, data pages included: no such fill may leave a hook (it would keep the page's
    stores slow) or an entry that lets a data page run."""
    m = Machine(HELLO_DYNAMIC, [HELLO_DYNAMIC], {}, RunOptions(), GuestIO.captured())
    assert m.run().exit_status == 0
    assert m.cpu.pages.arms == 0
    assert m.cpu.pages.fills > 0


CTYPES_CALLBACKS = """
import ctypes
compare = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int))
libc = ctypes.CDLL(None)
for sign in (1, -1, 1):  # a new libffi closure each round: its trampoline is code made at run time
    numbers = (ctypes.c_int * 8)(5, 3, 7, 1, 8, 2, 6, 4)
    libc.qsort(numbers, 8, 4, compare(lambda a, b, s=sign: (a[0] - b[0]) * s))
    print(list(numbers))
"""


def test_python_s_ctypes_callbacks_run_as_natively() -> None:
    """libffi's closures: code python3.11 makes at run time, called back from C."""
    argv = ["/usr/bin/python3.11", "-c", CTYPES_CALLBACKS]
    emulated = run_emulated(argv, {})
    assert emulated.observed() == run_native(argv, {}).observed()
    assert emulated.out.splitlines()[1] == b"[8, 7, 6, 5, 4, 3, 2, 1]"
