"""What each corpus entry prints on this machine's real kernel: recorded once, natively, beside the
corpus (``FILE.native.json`` for ``FILE.toml``), and compared with the emulated unprobed run of every
survey. A corpus run is evidence only if the emulation runs the program as Linux does: an entry whose
unprobed emulated output differs from its record is reported as unfaithful, whatever the probes did.

A record holds, per entry (by its content key and program name): the binary's sha256 (a record of another build of the
program is stale, not a difference), how the process ended (``exit N`` or ``signal N``), and the
sha256 and size of its standard output. Standard error is not compared: programs put their argv[0]
and the like there.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from emu.errors import UsageError
from emu.survey.corpus import Entry, file_sha256

RECORD_VERSION = 2


@dataclass(frozen=True, slots=True)
class Output:
    """How a run ended and what it printed on standard output."""

    ending: str  # "exit N" | "signal N" | "stopped: why" (a limit: no verdict)
    stdout_sha256: str
    stdout_size: int

    @classmethod
    def of(cls, ending: str, stdout: bytes) -> Output:
        return cls(ending, hashlib.sha256(stdout).hexdigest(), len(stdout))

    def differs_from(self, native: Output) -> str | None:
        """One line saying how this (emulated) output differs from ``native``; None: it does not."""
        if self.ending != native.ending:
            return f"{self.ending}, natively {native.ending}"
        if self.stdout_sha256 != native.stdout_sha256:
            return f"stdout differs ({self.stdout_size} bytes, natively {native.stdout_size})"
        return None


def record_path(corpus: str) -> str:
    """Where the native record of the corpus file ``corpus`` lives."""
    stem, ext = os.path.splitext(corpus)
    return (stem if ext == ".toml" else corpus) + ".native.json"


def record_key(entry: Entry) -> str:
    """An entry's key in the record: its content key (arguments, input, environment) and its program's
    name (not its path: a clone of the project records its own samples under another directory)."""
    return f"{entry.content_key()}:{os.path.basename(entry.binary)}"


def run_natively(entry: Entry) -> Output:
    """``entry`` on this machine's kernel, in an empty temporary directory, with only its environment."""
    with tempfile.TemporaryDirectory(prefix="uprobe-emu-native-") as cwd:
        try:
            done = subprocess.run([entry.binary, *entry.args], input=entry.stdin, env=dict(entry.env), cwd=cwd,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=entry.timeout_s)
        except subprocess.TimeoutExpired:
            return Output.of(f"stopped: natively past its {entry.timeout_s:g} s timeout", b"")
    code = done.returncode
    return Output.of(f"signal {-code}" if code < 0 else f"exit {code}", done.stdout)


@dataclass(frozen=True, slots=True)
class Recorded:
    binary_sha256: str
    output: Output


def record(entries: Sequence[Entry], path: str) -> dict[str, Recorded]:
    """Run every entry natively and write the record to ``path``."""
    records = {record_key(e): Recorded(file_sha256(e.binary), run_natively(e)) for e in entries}
    body = {"version": RECORD_VERSION,
            "entries": {key: {"name": e.name, "binary_sha256": records[key].binary_sha256,
                              **asdict(records[key].output)}
                        for e in entries if (key := record_key(e)) in records}}
    try:
        with open(path, "w") as fh:
            json.dump(body, fh, indent=1, sort_keys=True)
            fh.write("\n")
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror}") from None
    return records


def load(path: str) -> dict[str, Recorded]:
    """The record at ``path`` (entry content key -> record); empty if there is none."""
    try:
        with open(path) as fh:
            body = json.load(fh)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: not a native record ({exc})") from None
    try:
        if body["version"] != RECORD_VERSION:
            raise UsageError(f"{path}: a native record of version {body['version']} (want {RECORD_VERSION}: record again)")
        return {key: Recorded(str(r["binary_sha256"]), Output(str(r["ending"]), str(r["stdout_sha256"]),
                                                               int(r["stdout_size"])))
                for key, r in body["entries"].items()}
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise UsageError(f"{path}: not a native record (bad field {exc})") from None


def compare(entry: Entry, emulated: Output | None, records: dict[str, Recorded]) -> tuple[str, str | None]:
    """``entry``'s emulated unprobed run against its native record: ("same", None), ("differs", how),
    ("unrecorded" | "stale" | "stopped" | "failed", None): nothing to compare (no record, a record of
    another build of the binary, a limit stopped the run, the emulation could not run it)."""
    recorded = records.get(record_key(entry))
    if recorded is None:
        return "unrecorded", None
    if recorded.binary_sha256 != file_sha256(entry.binary):
        return "stale", None
    if emulated is None:
        return "failed", None
    if emulated.ending.startswith("stopped"):
        return "stopped", None
    how = emulated.differs_from(recorded.output)
    return ("same", None) if how is None else ("differs", how)


