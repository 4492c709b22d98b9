"""Saving a finding (standalone ELF, JSON record, replay command) and replaying one."""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass
from typing import Any, NamedTuple

from emu.designs import design_file_of, known_designs
from emu.errors import UsageError
from emu.fuzz import layout as L
from emu.fuzz.case import Case, aslr_seed
from emu.fuzz.codegen import Program, program
from emu.fuzz.elfwriter import write_elf
from emu.fuzz.oracle import Verdict, check_case
from emu.fuzz.shrink import shrink

RECORD_VERSION = 1


@dataclass(frozen=True, slots=True)
class Finding:
    case: Case  # shrunk
    original: Case
    verdict: Verdict  # of the shrunk case
    json_path: str
    elf_path: str
    design_file: str | None = None  # the user design's file, which replay must load again

    @property
    def replay_command(self) -> str:
        extra = f"--design-file {shlex.quote(self.design_file)} " if self.design_file else ""  # replay runs no file unnamed
        return f"uprobe-emu replay {extra}{shlex.quote(self.json_path)}"


def signature(case: Case, verdict: Verdict) -> tuple[str, str, bool, tuple[str, ...]]:
    """Findings with one signature are one bug for saving purposes (all are counted)."""
    kinds = tuple(sorted({v.split(":", 1)[0] for v in verdict.violations}))
    return verdict.design, case.site, verdict.differs, kinds


def shrink_finding(case: Case, verdict: Verdict) -> tuple[Case, Verdict]:
    def still_fails(candidate: Case) -> bool:
        v = check_case(candidate, verdict.design, aslr=verdict.aslr)
        return v.finding and (v.differs or not verdict.differs)

    small = shrink(case, still_fails)
    return small, check_case(small, verdict.design, aslr=verdict.aslr)


def site_bytes(prog: Program) -> bytes:
    at = prog.site - L.CODE_BASE
    return prog.code[at : at + prog.site_len]


def finding_stem(out_dir: str, case: Case, verdict: Verdict) -> str:
    """DIR/<design>-s<seed>-c<index>, with -aslr<SEED> when the finding's process was randomized
    (the same case under other layouts saves beside it, not over it)."""
    layout = "" if verdict.aslr is None else f"-aslr{verdict.aslr}"
    return os.path.join(out_dir, f"{verdict.design}-s{case.seed}-c{case.index}{layout}")


def save_finding(out_dir: str, case: Case, verdict: Verdict) -> Finding:
    """Shrink, then write the finding's .elf, .json and .replay.sh (named by finding_stem)."""
    small, small_verdict = shrink_finding(case, verdict)
    return write_finding(out_dir, case, small, small_verdict)


def write_finding(out_dir: str, case: Case, small: Case, small_verdict: Verdict) -> Finding:
    """Write the finding's .elf, .json and .replay.sh (named by finding_stem) for ``case``, shrunk to ``small``;
    the record holds the ASLR seed of the verdict's layout, which replay lays the process out from."""
    verdict = small_verdict
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out {out_dir}: {exc.strerror}") from None
    stem = finding_stem(out_dir, case, verdict)
    prog = program(small)
    finding = Finding(small, case, small_verdict, stem + ".json", stem + ".elf", design_file_of(verdict.design))
    try:
        write_elf(finding.elf_path, prog.code, prog.data)
        _write_script(stem + ".replay.sh", finding.replay_command)
    except OSError as exc:
        raise UsageError(f"cannot write {stem}.*: {exc.strerror}") from None
    record = {
        "version": RECORD_VERSION, "seed": case.seed, "index": case.index, "design": verdict.design,
        "design_file": finding.design_file, "aslr": verdict.aslr,
        "site": {"form": small.site, "address": hex(prog.site), "bytes": site_bytes(prog).hex()},
        "stores": len(small.stores), "expected": small_verdict.expected, "actual": small_verdict.actual,
        "differences": list(small_verdict.differences), "violations": list(small_verdict.violations),
        "case": small.to_json(), "original_case": case.to_json(), "elf": stem + ".elf",
        "replay": finding.replay_command,
        "native": f"{shlex.quote(stem + '.elf')} | xxd  # prints the unprobed result blocks; probe "
                  f"{hex(prog.site)} to compare",
    }
    _write_json(finding.json_path, record)
    return finding


def _write_script(path: str, command: str) -> None:
    with open(path, "w") as fh:
        fh.write(f"#!/bin/sh\n{command}\n")
    os.chmod(path, 0o755)


def _write_json(path: str, payload: dict[str, Any]) -> None:
    try:
        with open(path, "w") as fh:
            json.dump(payload, fh, indent=2)
            fh.write("\n")
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror}") from None


class Record(NamedTuple):
    """What replay needs of a saved finding."""

    case: Case  # the shrunk case
    design: str
    design_file: str | None  # None: a built-in design
    aslr: int | None  # the ASLR seed its process was laid out from; None (or a record without it): ASLR off


def load_record(path: str) -> Record:
    """The saved finding at ``path`` (its JSON, or the ELF next to it), every field checked."""
    if path.endswith(".elf"):
        path = path[: -len(".elf")] + ".json"
    record = _read_json(path)
    if not isinstance(record, dict) or "case" not in record or not isinstance(record.get("design"), str):
        raise UsageError(f"{path}: not a fuzz finding record (no case/design)")
    if not isinstance(record["case"], dict):
        raise UsageError(f"{path}: not a fuzz case record: the case is not an object")
    design_file = record.get("design_file")
    if design_file is not None and not isinstance(design_file, str):
        raise UsageError(f"{path}: not a fuzz finding record (design_file is not a path)")
    try:
        case = Case.from_json(record["case"])
        aslr = aslr_seed(record.get("aslr"))
    except UsageError as exc:
        raise UsageError(f"{path}: {exc}") from None
    return Record(case, record["design"], design_file or None, aslr)


def _read_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: not JSON (not UTF-8 text: byte {exc.object[exc.start]:#04x} at offset {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    except ValueError:  # json reads no integer of more than sys.get_int_max_str_digits() digits
        raise UsageError(f"{path}: not a fuzz finding record (a number with thousands of digits)") from None
    except RecursionError:
        raise UsageError(f"{path}: not a fuzz finding record (nested too deeply)") from None


def replay(path: str, design: str | None = None, trust_design_file: bool = False) -> tuple[Verdict, str]:
    """Re-run a saved finding (under its design, or ``design``, in its recorded layout): its verdict
    and the design used.

    A finding of a user's design names the file that defined it; that file is Python, and a finding
    may come from anyone, so it is run only with ``trust_design_file`` (the caller can instead load it
    with --design-file, having read it)."""
    record = load_record(path)
    used = design or record.design
    if used not in known_designs() and record.design_file is not None:
        if not trust_design_file:
            raise UsageError(f"{path}: its design {used!r} comes from {record.design_file}, which replay does not run "
                             f"on a finding's word: name it with --design-file (or pass --trust-design-file)")
        from emu.designs.file import load_design_file

        load_design_file(record.design_file)  # the finding's own design, from the file that defined it
    return check_case(record.case, used, aslr=record.aslr), used
