"""One file's survey: what `scan` finds, each site's red-zone verdict, and each design's hazard.

Runs on a worker (a Dask task): reads the file itself, checks it is the content the client hashed,
and returns plain data (picklable, JSON-able), never an exception for a bad file.
"""

from __future__ import annotations

import bisect
import hashlib
import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from emu.designs import Design
from emu.errors import EmuError
from emu.survey.bounds import UnwindBounds
from emu.survey.redzone import LIVE, Function, RedZone, analyse, unknown
from emu.survey.writes import red_zone_writes

ANALYSIS_VERSION = 3  # bump when a verdict could change: stored results of older versions are redone
CONTEXT_INSNS = 6  # instructions shown either side of a hazardous site in the report


@dataclass(frozen=True, slots=True)
class SiteSurvey:
    address: int
    kind: str
    symbol: str | None  # function+offset, or None outside any function symbol
    name: str  # labels or the USDT probe name
    insn: str
    red_zone: str
    reason: str | None
    live: tuple[tuple[int, int], ...]
    verdicts: dict[str, str]  # design -> scan's verdict (optimize / int3 / refused ...)
    hazard: dict[str, bool | None]
    context: str = ""  # disassembly around the site, for live sites

    def optimized(self, design: str) -> bool:
        return self.verdicts.get(design, "").startswith("optimize")


@dataclass(frozen=True, slots=True)
class FileSurvey:
    path: str
    sha256: str
    size: int
    status: str  # ok | not-elf | other-arch | bad-elf | unreadable | changed
    error: str | None = None
    sites: tuple[SiteSurvey, ...] = field(default_factory=tuple)

    def to_json(self) -> list[dict[str, Any]]:
        return site_rows(self.path, self.sites)


def site_rows(path: str, sites: Sequence[SiteSurvey]) -> list[dict[str, Any]]:
    """The JSON rows of ``sites`` found in ``path`` (live_bytes: inclusive offsets from rsp at the site)."""
    return [{"file": path, "address": s.address, "symbol": s.symbol, "name": s.name, "kind": s.kind, "insn": s.insn,
             "red_zone": s.red_zone, "reason": s.reason, "live_bytes": [list(x) for x in s.live],
             "designs": dict(s.verdicts), "hazard": dict(s.hazard)} for s in sites]


def hazard(design: Design, verdict: str, rz: RedZone) -> bool | None:
    """True: the design optimizes the site and writes a live byte; None: cannot tell."""
    if not verdict.startswith("optimize"):
        return False  # INT3 (or refused): the kernel writes nothing on the user stack on entry
    written = red_zone_writes(design)
    if written == ():
        return False
    if written is None or rz.state not in (LIVE, "dead"):
        return None
    return rz.hit_by(written)


def survey_file(path: str, sha256: str | None, designs: Sequence[Design]) -> FileSurvey:
    """The survey of ``path``; ``sha256``: the content the caller expects (None: whatever is there)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        return FileSurvey(path, sha256 or "", 0, "unreadable", exc.strerror)
    digest = hashlib.sha256(data).hexdigest()
    if sha256 is not None and digest != sha256:
        return FileSurvey(path, sha256, len(data), "changed", "the file changed during the survey")
    if data[:4] != b"\x7fELF":
        return FileSurvey(path, digest, len(data), "not-elf")
    from emu.scan import scan_file  # pyelftools and capstone: on the worker only

    try:
        result = scan_file(path, designs)
    except EmuError as err:
        status = "other-arch" if "not an x86-64 ELF" in str(err) else "bad-elf"
        return FileSurvey(path, digest, len(data), status, str(err))
    bounds = _Bounds(result, _unwind(data) if any(s.function is None for s in result.sites) else None)
    sites = tuple(_site(bounds, s, designs) for s in result.sites)
    return FileSurvey(path, digest, len(data), "ok", None, sites)


def _unwind(data: bytes) -> UnwindBounds | None:
    from elftools.elf.elffile import ELFFile

    try:
        return UnwindBounds.read(ELFFile(io.BytesIO(data)))
    except Exception:  # pyelftools on a damaged file: no bounds, the sites stay unknown
        return None


def _site(bounds: _Bounds, site: Any, designs: Sequence[Design]) -> SiteSurvey:
    fn = bounds.function(site.address)
    if fn is None:
        rz = unknown("no function symbol or unwind entry contains the site")
    else:
        rz = analyse(fn, site.address, executed=site.usdt is not None)
    verdicts = dict(site.designs)
    symbol = None if site.function is None else site.where
    context = _context(fn, site.address) if fn is not None and rz.state == LIVE else ""
    return SiteSurvey(site.address, site.kind, symbol, site.name, site.text, rz.state, rz.reason, rz.live, verdicts,
                      {d.name: hazard(d, verdicts[d.name], rz) for d in designs}, context)


class _Bounds:
    """The functions of one file: FUNC symbols (sorted once), else unwind entries; each decoded once."""

    def __init__(self, result: Any, unwind: UnwindBounds | None) -> None:
        self.image = result.image
        self.symbols: dict[int, tuple[str, int]] = result.bounds
        self.starts = sorted(self.symbols)
        self.unwind = unwind
        self.cache: dict[int, Function] = {}

    def around(self, address: int) -> tuple[int, int] | None:
        i = bisect.bisect_right(self.starts, address) - 1
        if i >= 0 and address < self.starts[i] + self.symbols[self.starts[i]][1]:
            return self.starts[i], self.symbols[self.starts[i]][1]
        return self.unwind.around(address) if self.unwind is not None else None

    def function(self, address: int) -> Function | None:
        bounds = self.around(address)
        if bounds is None:
            return None
        start, size = bounds
        if start not in self.cache:
            self.cache[start] = Function.build(self.image.bytes_at(start, size), start)
        return self.cache[start]


def _context(fn: Function, address: int) -> str:
    """The instructions around ``address``, the site marked."""
    order = sorted(fn.insns)
    i = order.index(address) if address in fn.insns else 0
    lines = []
    for a in order[max(0, i - CONTEXT_INSNS): i + CONTEXT_INSNS + 1]:
        insn = fn.insns[a]
        mark = "=>" if a == address else "  "
        lines.append(f"{mark} {a:#x}: {insn.raw.hex(' '):<30} {insn.text}")
    return "\n".join(lines)
