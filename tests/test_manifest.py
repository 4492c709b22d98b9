"""Checks elf_samples/MANIFEST against the committed sample binaries.

Stdlib + pytest only.  The checker functions are also run against damaged
copies in a temporary directory, so these tests are known to be able to fail.
"""

import hashlib
import re
import shutil
import struct
from pathlib import Path
from typing import TypedDict

import pytest

SAMPLES_DIR = Path(__file__).resolve().parent.parent / "elf_samples"
MANIFEST = "MANIFEST"

EXPECTED_SAMPLES = {
    "hello_static", "hello_static_pie", "hello_dynamic", "argv_env",
    "file_reader", "cpu_bound", "getpid_loop", "exit_code", "crash",
    "redzone_probe", "probe_targets", "usdt_sample", "hello_asm", "trig", "uret_edge", "usdt_args", "selfprobe", "signals",
    "uprobe_syscall", "rsb_shapes", "threads", "uprobe_race", "forks", "rmw_sites", "cpu_state",
    "linux_facts", "linux_facts_pie", "linux_facts_dyn", "live_state", "survey_cases", "survey_corpus",
    "store_loop", "page_perms", "bombs", "sigframes", "sig_hits", "sig_race", "timer_signals", "time_moves",
    "survey_readback", "librz.so", "rzlib_main", "sa_restart", "exec_script",
}

EM_X86_64 = 62
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")


class Entry(TypedDict):
    sha256: str
    name: str
    compiler: str
    flags: str
    line: int


def parse_manifest(path: Path) -> tuple[list[str], list[Entry]]:
    """Return (header_lines, entries); entries = list of dicts.

    Raises ValueError on a malformed line."""
    comments: list[str] = []
    entries: list[Entry] = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        if line.startswith("#"):
            comments.append(line)
            continue
        fields = line.split("\t")
        if len(fields) != 4:
            raise ValueError("line %d: expected 4 tab-separated fields, got %d"
                             % (lineno, len(fields)))
        sha, name, compiler, flags = fields
        if not _SHA_RE.match(sha):
            raise ValueError("line %d: bad sha256 %r" % (lineno, sha))
        if not name or "/" in name or name == MANIFEST:
            raise ValueError("line %d: bad name %r" % (lineno, name))
        if not compiler.strip():
            raise ValueError("line %d: empty compiler field" % lineno)
        entries.append({"sha256": sha, "name": name, "compiler": compiler,
                        "flags": flags, "line": lineno})
    return comments, entries


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def elf_problem(path: Path) -> str | None:
    """None if path is a 64-bit little-endian x86-64 ELF, else a message."""
    with open(path, "rb") as f:
        head = f.read(64)
    if len(head) < 20 or head[:4] != b"\x7fELF":
        return f"{path.name}: not an ELF file"
    if head[4] != 2:
        return "%s: not ELFCLASS64 (EI_CLASS=%d)" % (path.name, head[4])
    if head[5] != 1:
        return "%s: not little-endian (EI_DATA=%d)" % (path.name, head[5])
    (e_machine,) = struct.unpack_from("<H", head, 18)
    if e_machine != EM_X86_64:
        return "%s: e_machine=%d, want %d" % (path.name, e_machine, EM_X86_64)
    return None


def check_dir(directory: Path) -> list[str]:
    """All problems found in directory (empty list = consistent)."""
    problems = []
    mpath = directory / MANIFEST
    if not mpath.is_file():
        return [f"{mpath} missing"]
    try:
        comments, entries = parse_manifest(mpath)
    except ValueError as e:
        return [f"MANIFEST: {e}"]
    if not comments or not mpath.read_text(encoding="utf-8").startswith("#"):
        problems.append("MANIFEST: first line must be a '#' format comment")
    if not entries:
        problems.append("MANIFEST lists no files")
    names = [e["name"] for e in entries]
    for n in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"{n} listed more than once")
    for entry in entries:
        p = directory / entry["name"]
        if not p.is_file():
            problems.append("{} listed but missing".format(entry["name"]))
            continue
        actual = sha256_of(p)
        if actual != entry["sha256"]:
            problems.append("{}: sha256 {} != MANIFEST {}".format(entry["name"], actual, entry["sha256"]))
        bad = elf_problem(p)
        if bad:
            problems.append(bad)
    for p in sorted(directory.iterdir()):
        if p.name != MANIFEST and p.name not in names:
            problems.append(f"{p.name} present but not listed in MANIFEST")
    return problems


def _entries() -> list[Entry]:
    try:
        return parse_manifest(SAMPLES_DIR / MANIFEST)[1]
    except (OSError, ValueError):
        return []


ENTRIES = _entries()


# ---- the real directory ------------------------------------------------------

def test_manifest_exists_and_parses() -> None:
    mpath = SAMPLES_DIR / MANIFEST
    assert mpath.is_file(), f"{mpath} missing"
    comments, entries = parse_manifest(mpath)
    first = mpath.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("#") and "sha256" in first, first
    assert entries


def test_manifest_lists_expected_samples() -> None:
    names = [e["name"] for e in ENTRIES]
    assert len(names) == len(set(names)), "duplicate entries"
    assert set(names) == EXPECTED_SAMPLES


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["name"] for e in ENTRIES])
def test_listed_file_exists(entry: Entry) -> None:
    assert (SAMPLES_DIR / entry["name"]).is_file()


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["name"] for e in ENTRIES])
def test_sha256_matches(entry: Entry) -> None:
    assert sha256_of(SAMPLES_DIR / entry["name"]) == entry["sha256"]


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["name"] for e in ENTRIES])
def test_is_x86_64_elf(entry: Entry) -> None:
    assert elf_problem(SAMPLES_DIR / entry["name"]) is None


def test_every_file_is_listed() -> None:
    listed = {e["name"] for e in ENTRIES}
    present = {p.name for p in SAMPLES_DIR.iterdir()} - {MANIFEST}
    assert present - listed == set(), "unlisted files"
    assert listed - present == set(), "listed but missing"


def test_check_dir_clean() -> None:
    assert check_dir(SAMPLES_DIR) == []


# ---- the checker must catch damage (run on copies) ---------------------------

@pytest.fixture
def copy_dir(tmp_path: Path) -> Path:
    dst = tmp_path / "elf_samples"
    shutil.copytree(SAMPLES_DIR, dst)
    assert check_dir(dst) == []
    return dst


def _some_sample(d: Path) -> Path:
    return d / sorted(EXPECTED_SAMPLES)[0]


def test_detects_modified_binary(copy_dir: Path) -> None:
    p = _some_sample(copy_dir)
    data = bytearray(p.read_bytes())
    data[-1] ^= 0xFF
    p.write_bytes(bytes(data))
    probs = check_dir(copy_dir)
    assert any("sha256" in x and p.name in x for x in probs), probs


def test_detects_missing_binary(copy_dir: Path) -> None:
    p = _some_sample(copy_dir)
    p.unlink()
    assert any("listed but missing" in x for x in check_dir(copy_dir))


def test_detects_unlisted_file(copy_dir: Path) -> None:
    (copy_dir / "stray").write_bytes(b"\x7fELF")
    assert any("stray" in x and "not listed" in x for x in check_dir(copy_dir))


def test_detects_non_x86_64(copy_dir: Path) -> None:
    p = _some_sample(copy_dir)
    data = bytearray(p.read_bytes())
    struct.pack_into("<H", data, 18, 183)  # EM_AARCH64
    p.write_bytes(bytes(data))
    probs = check_dir(copy_dir)
    assert any("e_machine=183" in x for x in probs), probs


def test_detects_non_elf_even_with_matching_hash(copy_dir: Path) -> None:
    m = copy_dir / MANIFEST
    p = _some_sample(copy_dir)
    p.write_bytes(b"#!/bin/sh\nexit 0\n")
    text = m.read_text(encoding="utf-8")
    old = next(e for e in parse_manifest(m)[1] if e["name"] == p.name)
    m.write_text(text.replace(old["sha256"], sha256_of(p)), encoding="utf-8")
    probs = check_dir(copy_dir)
    assert probs == [f"{p.name}: not an ELF file"], probs


def test_detects_malformed_line(copy_dir: Path) -> None:
    m = copy_dir / MANIFEST
    m.write_text(m.read_text(encoding="utf-8") + "deadbeef  oops\n",
                 encoding="utf-8")
    probs = check_dir(copy_dir)
    assert probs and probs[0].startswith("MANIFEST:"), probs
