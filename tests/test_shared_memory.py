"""MAP_SHARED memory is one set of host pages for every process that maps it: a fork child and its
parent see each other's stores at once, through anonymous shared memory and through a shared
mapping of a /dev/shm file; MAP_PRIVATE stays a copy (the negative control)."""

from __future__ import annotations

from pathlib import Path

import pytest

from emu.abi import PAGE_SIZE, Prot
from emu.cli import main
from emu.cpu import Cpu
from emu.process.memory import Memory
from emu.process.vma import SharedPages

PY = "/usr/bin/python3.11"
RW = Prot.READ | Prot.WRITE
BASE = 0x10000000

# The parent maps, forks; the child stores through the mapping (and a second mapping of the file);
# the parent prints what it then sees through its own mapping and, for the file, what read() gives.
SCRIPT = """
import mmap, os, sys
kind, flag = sys.argv[1], mmap.MAP_SHARED if sys.argv[2] == "shared" else mmap.MAP_PRIVATE
if kind == "anon":
    fd, m = -1, mmap.mmap(-1, 4096, flags=flag)
else:
    fd = os.open("/dev/shm/shared-test", os.O_RDWR | os.O_CREAT, 0o600)
    os.ftruncate(fd, 4096)
    m = mmap.mmap(fd, 4096, flags=flag)
m[0:5] = b"start"
pid = os.fork()
if pid == 0:
    m[0:5] = b"child"
    if fd >= 0:
        mmap.mmap(fd, 4096, flags=flag)[8:12] = b"more"
    os._exit(0)
os.waitpid(pid, 0)
print(bytes(m[0:12]), os.pread(fd, 12, 0) if fd >= 0 else b"")
"""


def _run(tmp_path: Path, capfd: pytest.CaptureFixture[str], *args: str) -> str:
    script = tmp_path / "shared.py"
    script.write_text(SCRIPT)
    capfd.readouterr()
    assert main(["run", "--timeout", "120", PY, str(script), *args]) == 0
    return capfd.readouterr().out.strip()


@pytest.mark.parametrize(("kind", "expect"), [
    ("anon", "b'child\\x00\\x00\\x00\\x00\\x00\\x00\\x00' b''"),
    ("shm", "b'child\\x00\\x00\\x00more' b'child\\x00\\x00\\x00more'"),
])
def test_a_fork_child_stores_reach_the_parent(kind: str, expect: str, tmp_path: Path,
                                               capfd: pytest.CaptureFixture[str]) -> None:
    assert _run(tmp_path, capfd, kind, "shared") == expect


@pytest.mark.parametrize(("kind", "expect"), [
    ("anon", "b'start\\x00\\x00\\x00\\x00\\x00\\x00\\x00' b''"),
    ("shm", "b'start\\x00\\x00\\x00\\x00\\x00\\x00\\x00' b'\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00'"),
])
def test_private_mappings_stay_private(kind: str, expect: str, tmp_path: Path,
                                       capfd: pytest.CaptureFixture[str]) -> None:
    assert _run(tmp_path, capfd, kind, "private") == expect


def _pair(shared: bool) -> tuple[Memory, Memory]:
    parent, child = Memory(Cpu()), Memory(Cpu())
    backing = (SharedPages(4 * PAGE_SIZE), 0) if shared else None
    parent.map(BASE, 4 * PAGE_SIZE, RW, shared=shared, backing=backing)
    parent.copy_to(child, lambda _: True)
    return parent, child


def test_fork_maps_the_same_host_pages_through_splits_and_unmaps() -> None:
    parent, child = _pair(shared=True)
    assert parent.protect(BASE + PAGE_SIZE, PAGE_SIZE, Prot.READ)  # split in the parent's engine
    child.unmap(BASE + 3 * PAGE_SIZE, PAGE_SIZE)  # the child drops a piece; the parent keeps it
    child.write(BASE + PAGE_SIZE + 4, b"both")
    assert parent.read(BASE + PAGE_SIZE + 4, 4) == b"both"
    parent.write(BASE + 3 * PAGE_SIZE, b"kept")
    assert parent.read(BASE + 3 * PAGE_SIZE, 4) == b"kept"
    grandchild = Memory(Cpu())
    child.copy_to(grandchild, lambda _: True)
    parent.write(BASE, b"seen")
    assert grandchild.read(BASE, 4) == b"seen"
    assert [(b.start, b.end) for b in grandchild.backings] == [(BASE, BASE + 3 * PAGE_SIZE)]


def test_a_private_mapping_is_copied_at_fork() -> None:
    parent, child = _pair(shared=False)
    child.write(BASE, b"mine")
    assert parent.read(BASE, 4) == bytes(4)
    assert not child.backings
