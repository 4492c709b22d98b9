"""Which red-zone bytes are live across a probe site, from the containing function's control flow.

The function's code is swept into instructions and edges (direct jumps and fall-through; a `ret`
or a jump out of the function ends a path). Registers holding stack addresses are propagated
from the entry (stack.py), so every stack access has an entry-relative address. For the site with
rsp = S, the red zone is [S-128, S). A byte there is **live** if some path from the entry stores it
before the site (and no call in between hands it to a callee) and some path from the site reads it
before storing it again or calling out. Both are may-analyses over a 128-bit mask per instruction.

``unknown`` (with the reason) when the answer cannot be read off the code: an indirect jump after
the site, a site reached only through one, rsp unknowable at the site or an access near it whose
extent is unknown, no function bounds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from emu.abi import RED_ZONE
from emu.survey.stack import RSP, Effect, Insn, Range, Regs, decode, effect

LIVE, DEAD, UNKNOWN = "live", "dead", "unknown"
FULL = (1 << RED_ZONE) - 1


@dataclass(frozen=True, slots=True)
class RedZone:
    state: str  # live | dead | unknown
    live: tuple[tuple[int, int], ...] = ()  # inclusive offsets from rsp at the site, e.g. ((-8, -1),)
    reason: str | None = None

    def hit_by(self, written: Iterable[tuple[int, int]]) -> bool:
        """Do any of ``written`` (inclusive rsp offsets) overlap a live byte?"""
        return any(lo <= whi and wlo <= hi for lo, hi in self.live for wlo, whi in written)


def unknown(reason: str) -> RedZone:
    return RedZone(UNKNOWN, reason=reason)


@dataclass
class Function:
    """One function's instructions and edges; the stack registers known before each instruction
    are propagated on first use (a function whose sites are all unreachable never needs them)."""

    start: int
    end: int
    insns: dict[int, Insn]
    succs: dict[int, tuple[int, ...]]
    indirect: frozenset[int]  # addresses of indirect jumps
    outward: frozenset[int]  # direct jumps to outside the bounds (tail calls, or into a split-off part)
    preds: dict[int, tuple[int, ...]]
    problem: str | None = None  # a jump into the middle of an instruction
    _flow: tuple[dict[int, Regs], dict[int, Effect]] | None = None
    _entry_reach: set[int] | None = None

    @property
    def regs_in(self) -> dict[int, Regs]:
        """Registers known before each instruction reached from the entry."""
        return self._propagated()[0]

    @property
    def effects(self) -> dict[int, Effect]:
        return self._propagated()[1]

    def _propagated(self) -> tuple[dict[int, Regs], dict[int, Effect]]:
        if self._flow is None:
            self._flow = _propagate(self.start, self.insns, self.succs)
        return self._flow

    def reached(self, address: int) -> bool:
        """Is ``address`` reached from the entry by direct branches and fall-through?"""
        if self._entry_reach is None:
            self._entry_reach = self.reach(self.start, self.succs) if self.start in self.insns else set()
        return address in self._entry_reach

    @classmethod
    def build(cls, code: bytes, start: int) -> Function:
        insns = {i.address: i for i in decode(code, start)}
        end = start + len(code)
        succs: dict[int, tuple[int, ...]] = {}
        indirect: set[int] = set()
        outward: set[int] = set()
        problem = None
        for a, insn in insns.items():
            out, bad = _successors(insn, start, end, insns)
            succs[a] = out
            problem = problem or bad
            if insn.mnemonic == "jmp" and insn.direct_target is None:
                indirect.add(a)
            target = insn.direct_target
            if insn.mnemonic.startswith("j") and target is not None and not start <= target < end:
                outward.add(a)
        back: dict[int, list[int]] = {}
        for a, outs in succs.items():
            for b in outs:
                back.setdefault(b, []).append(a)
        preds = {b: tuple(v) for b, v in back.items()}
        return cls(start, end, insns, succs, frozenset(indirect), frozenset(outward), preds, problem)

    def reach(self, origin: int, edges: dict[int, tuple[int, ...]]) -> set[int]:
        seen, todo = {origin}, [origin]
        while todo:
            for nxt in edges.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen


def _successors(insn: Insn, start: int, end: int, insns: dict[int, Insn]) -> tuple[tuple[int, ...], str | None]:
    m = insn.mnemonic
    if m.startswith("ret") or m in ("ud2", "hlt", "int3") or (m == "jmp" and insn.direct_target is None):
        return (), None
    targets: list[int] = []
    if m == "jmp" or (m.startswith("j") or m.startswith("loop")) and insn.direct_target is not None:
        target = insn.direct_target
        if target is not None and start <= target < end:  # outside: a tail call, which ends the path
            if target not in insns:
                return (), f"jump into the middle of an instruction at {insn.address:#x}"
            targets.append(target)
    if m != "jmp" and insn.end in insns:
        targets.append(insn.end)
    return tuple(dict.fromkeys(targets)), None


def _propagate(start: int, insns: dict[int, Insn],
               succs: dict[int, tuple[int, ...]]) -> tuple[dict[int, Regs], dict[int, Effect]]:
    """Forward: registers known before each reachable instruction (a merge keeps only agreeing ones)."""
    regs_in: dict[int, Regs] = {start: {RSP: 0}} if start in insns else {}
    effects: dict[int, Effect] = {}
    todo = [start] if start in insns else []
    while todo:
        a = todo.pop()
        eff = effect(insns[a], regs_in[a])
        effects[a] = eff
        for b in succs[a]:
            old = regs_in.get(b)
            new = eff.regs if old is None else {r: v for r, v in old.items() if eff.regs.get(r) == v}
            if old is None or new != old:
                regs_in[b] = new
                todo.append(b)
    return regs_in, effects


def _mask(ranges: Iterable[Range], lo: int) -> int:
    """Bits of the window [lo, lo + 128) covered by ``ranges``."""
    bits = 0
    for a, b in ranges:
        a, b = max(a, lo), min(b, lo + RED_ZONE)
        if a < b:
            bits |= ((1 << (b - a)) - 1) << (a - lo)
    return bits


def _kills(eff: Effect, lo: int) -> int:
    clobber = 0
    if eff.clobber_below is not None:
        clobber = _mask([(lo, eff.clobber_below)], lo)
    return _mask(eff.stores, lo) | clobber


ENTERED_NOTE = ("entered from outside its function's direct flow (a split-off part): every byte read after the "
                "site is taken as stored before it")


def analyse(fn: Function, site: int, executed: bool = False) -> RedZone:
    """The red-zone verdict for a site at ``site`` inside ``fn``. ``executed``: the site is known to
    run (a USDT note), so one not reached from the entry is entered by a jump from elsewhere (GCC's
    .cold parts), not dead padding."""
    if fn.problem:
        return unknown(fn.problem)
    if site not in fn.insns:
        return unknown("the site is not on an instruction boundary of its function's sweep")
    if not fn.reached(site):
        if executed:
            return _entered_at(fn, site)
        return unknown("the site is not reached from the function entry by direct branches")
    rsp = fn.regs_in[site].get(RSP)
    if rsp is None:
        return unknown("rsp not known relative to the function entry at the site")
    after = fn.reach(site, fn.succs)
    before = fn.reach(site, fn.preds) & set(fn.regs_in)
    blocked = _blocked(fn, fn.effects, after, before) or _jumps_out(fn, after, tail_ok=True)
    if blocked:
        return unknown(blocked)
    lo = rsp - RED_ZONE
    live = _stored(fn, site, lo, before) & _read(fn.succs, fn.effects, lo, after, site)
    return RedZone(LIVE, spans(live, lo - rsp)) if live else RedZone(DEAD)


def _entered_at(fn: Function, site: int) -> RedZone:
    """Liveness alone, from rsp = 0 at the site (what came before is outside the function's code)."""
    _regs, effects = _propagate(site, fn.insns, fn.succs)
    after = set(effects)
    blocked = _blocked(fn, effects, after, set()) or _jumps_out(fn, after, tail_ok=False)
    if blocked:
        return unknown(blocked)
    live = _read(fn.succs, effects, -RED_ZONE, after, site)
    return RedZone(LIVE if live else DEAD, spans(live, -RED_ZONE), ENTERED_NOTE)


def _jumps_out(fn: Function, after: set[int], tail_ok: bool) -> str | None:
    """A jump out of the bounds is a tail call when rsp is back at its entry value; otherwise the
    function goes on elsewhere (a .cold part jumping back to its hot part), where reads are unseen."""
    for a in sorted(after & fn.outward):
        if not (tail_ok and fn.regs_in.get(a, {}).get(RSP) == 0):
            return f"jump out of the function's bounds at {a:#x} with the stack in use (a split function)"
    return None


def _blocked(fn: Function, effects: dict[int, Effect], after: set[int], before: set[int]) -> str | None:
    """Why the code around the site cannot be read: an indirect jump after it, an opaque access."""
    for a in sorted(after):
        if a in fn.indirect:
            return f"indirect jump at {a:#x} after the site"
    for a in sorted(after | before):
        eff = effects.get(a)
        if eff is not None and eff.opaque:
            return eff.opaque
    return None


def _stored(fn: Function, site: int, lo: int, region: set[int]) -> int:
    """May-stored bytes at the site: forward over the instructions that reach it."""
    out: dict[int, int] = {}
    todo = [fn.start] if fn.start in region else []
    preds = fn.preds
    while todo:
        a = todo.pop()
        into = 0
        for p in preds.get(a, ()):
            into |= out.get(p, 0)
        eff = fn.effects[a]
        clobber = _mask([(lo, eff.clobber_below)], lo) if eff.clobber_below is not None else 0
        new = (into & ~clobber) | _mask(eff.stores, lo)
        if out.get(a) != new:
            out[a] = new
            todo.extend(b for b in fn.succs[a] if b in region)
    stored = 0
    for p in preds.get(site, ()):
        stored |= out.get(p, 0)
    return stored


def _read(succs: dict[int, tuple[int, ...]], effects: dict[int, Effect], lo: int, region: set[int], site: int) -> int:
    """May-live bytes just after the site: backward over the instructions it reaches."""
    live_in: dict[int, int] = {}
    changed = True
    order = sorted(region, reverse=True)
    while changed:
        changed = False
        for a in order:
            eff = effects[a]
            live_out = 0
            for b in succs[a]:
                live_out |= live_in.get(b, 0)
            new = (live_out & ~_kills(eff, lo)) | _mask(eff.loads, lo)
            if live_in.get(a) != new:
                live_in[a] = new
                changed = True
    return live_in.get(site, 0) & FULL


def spans(bits: int, base: int) -> tuple[tuple[int, int], ...]:
    """Runs of set bits as inclusive offsets (bit i is offset base + i)."""
    spans: list[tuple[int, int]] = []
    i = 0
    while i < RED_ZONE:
        if bits >> i & 1:
            j = i
            while j + 1 < RED_ZONE and bits >> (j + 1) & 1:
                j += 1
            spans.append((base + i, base + j))
            i = j + 1
        else:
            i += 1
    return tuple(spans)
