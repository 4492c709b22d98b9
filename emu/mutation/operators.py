"""The mutation operators: small flaws (and equivalent changes) made to a design's trampoline and
return code through the design API, as text lines of assembly (emu/mutation/__init__.py runs them)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from emu.abi import RED_ZONE
from emu.designs import Branch, Design, DesignError, Exit, Layout
from emu.errors import UsageError

LIVE_STATE = str(Path(__file__).resolve().parent.parent.parent / "elf_samples" / "live_state")
ROUNDS = "3"  # hits per site: the first is INT3 (it optimizes the site), the next two take the trampoline
STRAY = "0x5a"  # what the stray stores write (no live value of live_state holds it)
Edit = Callable[[Design, "Target"], Iterator[tuple[str, Design]]]


@dataclass(frozen=True, slots=True)
class Target:
    """The program mutants run on: its path, arguments and the address of its live global."""

    path: str = LIVE_STATE
    args: tuple[str, ...] = (ROUNDS,)
    global_address: int = 0


@dataclass(frozen=True, slots=True)
class Mutant:
    operator: str
    change: str  # what was changed, in words
    design: Design
    equivalent: bool = False


# ------------------------------------------------------------------------------ code as lines
def instructions(code: str | bytes) -> list[str] | None:
    """The trampoline's instructions, one each (None: given as bytes, not text to edit)."""
    if isinstance(code, bytes):
        return None
    lines = [part.split("#")[0].strip() for line in code.splitlines() for part in line.split(";")]
    return [line for line in lines if line]


def code_of(design: Design) -> str:
    parts = []
    if design.patch is not None and design.patch.prefix:
        parts.append(f"site prefix: {design.patch.prefix!r}")
    if design.trampoline is not None:
        code = design.trampoline.code
        parts.append("trampoline: " + ("; ".join(instructions(code) or []) if isinstance(code, str) else code.hex()))
    if design.handler is not None:
        h = design.handler
        parts.append(f"handler: saved={h.saved} saved_offset={h.saved_offset} sp_skip={h.sp_skip} exit={h.exit}")
    return " | ".join(parts)


@dataclass(frozen=True, slots=True)
class Code:
    """The code an operator edits: the trampoline a patched site reaches, or the uretprobe's return
    trampoline (only one with a syscall and given as text: an INT3 one has nothing to edit)."""

    part: str  # the Design field: "trampoline" or "uretprobe"

    def insns(self, design: Design) -> list[str]:
        code = getattr(design, self.part).code
        return instructions(code) or []

    def with_code(self, design: Design, insns: list[str]) -> Design:
        return replace(design, **{self.part: replace(getattr(design, self.part), code="; ".join(insns))})

    def nr(self, design: Design) -> int | None:
        return design.handler.nr if self.part == "trampoline" and design.handler else design.uretprobe.nr

    def editable(self, design: Design) -> bool:
        part = getattr(design, self.part)
        return part is not None and self.nr(design) is not None and instructions(part.code) is not None


ENTRY, RETURN = Code("trampoline"), Code("uretprobe")


def _with_code(design: Design, insns: list[str]) -> Design:
    return ENTRY.with_code(design, insns)


def _with_handler(design: Design, **changes: Any) -> Design:
    assert design.handler is not None
    return replace(design, handler=replace(design.handler, **changes))


def _insns(design: Design) -> list[str]:
    assert design.trampoline is not None
    return instructions(design.trampoline.code) or []


def _entry_depth(design: Design) -> int:
    """How far below the site's rsp the trampoline starts: the site's lea, then a call's push."""
    assert design.handler is not None and design.patch is not None
    lea = design.handler.sp_skip if design.patch.prefix else 0
    return lea + (8 if design.patch.branch is Branch.CALL else 0)


def _before_syscall_setup(insns: list[str], nr: int | None = 336) -> int:
    """The index of the instruction loading the syscall number ``nr`` (code inserted there runs after
    every save and before the kernel)."""
    for i, insn in enumerate(insns):
        m = re.match(r"movq?\s+\$(\w+),\s*%[re]ax", insn)
        if m is not None and nr is not None and int(m.group(1), 0) == nr:
            return i
    return next(i for i, insn in enumerate(insns) if insn == "syscall")


def _is_syscall_or_nr(insn: str) -> bool:
    return insn == "syscall" or re.match(r"movq?\s+\$\d+,\s*%[re]ax", insn) is not None


# ------------------------------------------------------------------------------ the operators
def drop_insn(design: Design, _t: Target, part: Code = ENTRY) -> Iterator[tuple[str, Design]]:
    insns = part.insns(design)
    for i, insn in enumerate(insns):
        if insn != "int3" and not _is_syscall_or_nr(insn):  # int3 after the ret is never reached
            yield f"drop #{i} `{insn}`", part.with_code(design, insns[:i] + insns[i + 1 :])


def swap_insns(design: Design, _t: Target, part: Code = ENTRY) -> Iterator[tuple[str, Design]]:
    insns = part.insns(design)
    for i in range(len(insns) - 1):
        a, b = insns[i], insns[i + 1]
        if a != b and "int3" not in (a, b) and not (_is_syscall_or_nr(a) or _is_syscall_or_nr(b)):
            yield f"swap #{i} `{a}` and #{i + 1} `{b}`", part.with_code(design, insns[:i] + [b, a] + insns[i + 2 :])


_DISPLACEMENT = re.compile(r"(-?\d+)\(%rsp\)")
_IMMEDIATE = re.compile(r"^(ret)\s+\$(\d+)$")


def change_immediate(design: Design, _t: Target) -> Iterator[tuple[str, Design]]:
    """A displacement or an immediate off by 8 (the syscall number is left alone: it must be 336)."""
    insns = _insns(design)
    for i, insn in enumerate(insns):
        m = _DISPLACEMENT.search(insn) or _IMMEDIATE.match(insn)
        if m is None:
            continue
        group = 1 if m.re is _DISPLACEMENT else 2
        value = int(m.group(group))
        changed = insn[: m.start(group)] + str(value + 8) + insn[m.end(group) :]
        yield f"#{i} `{insn}` -> `{changed}`", _with_code(design, insns[:i] + [changed] + insns[i + 1 :])
    if design.patch is not None and isinstance(design.patch.prefix, str) and _DISPLACEMENT.search(design.patch.prefix):
        prefix = _DISPLACEMENT.sub(lambda m: str(int(m.group(1)) + 8) + "(%rsp)", design.patch.prefix)
        yield f"site prefix -> `{prefix}`", replace(design, patch=replace(design.patch, prefix=prefix))


_LEA_RSP = re.compile(r"^lea\s+(-?\d+)\(%rsp\),\s*%rsp$")


def lea_to_arith(design: Design, _t: Target) -> Iterator[tuple[str, Design]]:
    """``lea -N(%rsp),%rsp`` -> ``sub $N,%rsp`` / ``add $-N,%rsp`` (same rsp, the flags clobbered)."""
    insns = _insns(design)
    for i, insn in enumerate(insns):
        m = _LEA_RSP.match(insn)
        if m is not None:
            n = int(m.group(1))
            for form in (f"sub ${-n}, %rsp", f"add ${n}, %rsp"):
                yield f"#{i} `{insn}` -> `{form}`", _with_code(design, insns[:i] + [form] + insns[i + 1 :])
    if design.patch is not None and isinstance(design.patch.prefix, str):
        m = _LEA_RSP.match(design.patch.prefix.strip())
        if m is not None:
            form = f"sub ${-int(m.group(1))}, %rsp"
            yield f"site prefix -> `{form}`", replace(design, patch=replace(design.patch, prefix=form))


def stray_store(design: Design, target: Target) -> Iterator[tuple[str, Design]]:
    """A store the original instruction does not make: into the red zone, the frame above rsp, a global."""
    insns, depth = _insns(design), _entry_depth(design)
    yield "red zone (site rsp-64)", _with_code(design, [f"movq ${STRAY}, {depth - 64}(%rsp)", *insns])
    yield "frame above rsp (site rsp+8)", _with_code(design, [f"movq ${STRAY}, {depth + 8}(%rsp)", *insns])
    if target.global_address:
        at = _before_syscall_setup(insns)
        store = ["push %rax", f"mov ${target.global_address:#x}, %eax", f"movq ${STRAY}, (%rax)", "pop %rax"]
        yield "a global (live_global)", _with_code(design, insns[:at] + store + insns[at:])


def set_flag(design: Design, _t: Target, part: Code = ENTRY) -> Iterator[tuple[str, Design]]:
    insns = part.insns(design)
    at = _before_syscall_setup(insns, part.nr(design))
    for name, code in (("std", ["std"]), ("stc", ["stc"]), ("clc", ["clc"]),
                       ("AC", ["pushf", "xorl $0x40000, (%rsp)", "popf"]),
                       ("ID", ["pushf", "xorl $0x200000, (%rsp)", "popf"])):
        yield f"{name} before the syscall", part.with_code(design, insns[:at] + code + insns[at:])


def clobber_gpr(design: Design, _t: Target, part: Code = ENTRY) -> Iterator[tuple[str, Design]]:
    insns = part.insns(design)
    at = _before_syscall_setup(insns, part.nr(design))
    for reg in ("rbx", "rdx", "rsi", "r8", "r12", "r15"):
        yield f"mov $0x5a, %{reg} after the saves", part.with_code(design, insns[:at] + [f"mov $0x5a, %{reg}"] + insns[at:])


def clobber_vector(design: Design, _t: Target, part: Code = ENTRY) -> Iterator[tuple[str, Design]]:
    insns = part.insns(design)
    at = _before_syscall_setup(insns, part.nr(design))
    for code in ("pxor %xmm0, %xmm0", "xorps %xmm15, %xmm15", "fldz", "fninit"):
        yield f"`{code}` after the saves", part.with_code(design, insns[:at] + [code] + insns[at:])


def clobber_control(design: Design, _t: Target, part: Code = ENTRY) -> Iterator[tuple[str, Design]]:
    """The SSE or x87 control word changed after the saves (through a stack word: below the red
    zone where the design already is, in it where it is not)."""
    insns = part.insns(design)
    at = _before_syscall_setup(insns, part.nr(design))
    for what, code in (("mxcsr -> 0x1fa0", ["pushq $0x1fa0", "ldmxcsr (%rsp)", "lea 8(%rsp), %rsp"]),
                       ("fcw -> 0x27f", ["pushq $0x27f", "fldcw (%rsp)", "lea 8(%rsp), %rsp"])):
        yield what, part.with_code(design, insns[:at] + code + insns[at:])


def unbalanced_stack(design: Design, _t: Target, part: Code = ENTRY) -> Iterator[tuple[str, Design]]:
    """rsp moved after the saves and never moved back."""
    insns = part.insns(design)
    at = _before_syscall_setup(insns, part.nr(design))
    for form in ("lea -8(%rsp), %rsp", "lea 8(%rsp), %rsp"):
        yield f"`{form}` after the saves", part.with_code(design, insns[:at] + [form] + insns[at:])


def drop_site_prefix(design: Design, _t: Target) -> Iterator[tuple[str, Design]]:
    """The site's own code before the branch (nop10: the lea over the red zone) dropped, the
    handler left as it was."""
    if design.patch is not None and design.patch.prefix:
        yield f"site prefix {design.patch.prefix!r} dropped", replace(design, patch=replace(design.patch, prefix=b""))


def saved_order(design: Design, _t: Target) -> Iterator[tuple[str, Design]]:
    assert design.handler is not None
    saved = design.handler.saved
    for i in range(len(saved) - 1):
        order = saved[:i] + (saved[i + 1], saved[i]) + saved[i + 2 :]
        yield f"saved {saved} -> {order}", _with_handler(design, saved=order)


def off_by_eight(design: Design, _t: Target) -> Iterator[tuple[str, Design]]:
    assert design.handler is not None
    h = design.handler
    for what in ("sp_skip", "saved_offset"):
        for delta in (8, -8):
            value = getattr(h, what) + delta
            if value >= 0:
                yield f"{what} {getattr(h, what)} -> {value}", _with_handler(design, **{what: value})


def wrong_exit(design: Design, _t: Target) -> Iterator[tuple[str, Design]]:
    assert design.handler is not None
    if design.handler.exit is Exit.IRET:
        yield "exit iret -> sysret", _with_handler(design, exit="sysret")


def missing_pop(design: Design, _t: Target, part: Code = ENTRY) -> Iterator[tuple[str, Design]]:
    """A pop of a call trampoline's epilogue skipped with ``lea 8(%rsp),%rsp`` (rsp balanced, the register not restored)."""
    insns = part.insns(design)
    for i, insn in enumerate(insns):
        if insn.startswith("pop "):
            yield f"#{i} `{insn}` -> `lea 8(%rsp), %rsp`", part.with_code(design, [*insns[:i], "lea 8(%rsp), %rsp",
                                                                                     *insns[i + 1 :]])


# Equivalent mutants: each must come out clean.
def deeper_lea(design: Design, _t: Target) -> Iterator[tuple[str, Design]]:
    assert design.handler is not None
    insns = _insns(design)
    for i, insn in enumerate(insns):
        m = _LEA_RSP.match(insn)
        if m is not None and -int(m.group(1)) == design.handler.sp_skip:
            form = f"lea {int(m.group(1)) - 64}(%rsp), %rsp"
            yield (f"#{i} `{insn}` -> `{form}`, sp_skip +64",
                   _with_handler(_with_code(design, insns[:i] + [form] + insns[i + 1 :]), sp_skip=design.handler.sp_skip + 64))


def leading_nop(design: Design, _t: Target, part: Code = ENTRY) -> Iterator[tuple[str, Design]]:
    yield "nop first", part.with_code(design, ["nop", *part.insns(design)])


def one_more_saved(design: Design, _t: Target) -> Iterator[tuple[str, Design]]:
    """push %rdx before the other saves and name it last in Handler.saved (the words are read from rsp upward)."""
    assert design.handler is not None
    insns = _insns(design)
    first_push = next((i for i, insn in enumerate(insns) if insn.startswith("push ")), None)
    if first_push is None or "dx" in design.handler.saved or design.handler.exit is Exit.TRAMPOLINE:
        return  # a 'trampoline' exit pops the saved words itself: its epilogue would need the pop too
    stepped = [m for insn in insns[:first_push] if (m := _LEA_RSP.match(insn)) is not None]
    if not any(-int(m.group(1)) >= RED_ZONE for m in stepped):
        return  # its pushes land in the red zone: one more is one more clobbered word, not an equivalent
    yield "push %rdx, saved + ('dx',)", _with_handler(
        _with_code(design, insns[:first_push] + ["push %rdx"] + insns[first_push:]), saved=(*design.handler.saved, "dx"))


def ret_saved_order(design: Design, _t: Target) -> Iterator[tuple[str, Design]]:
    """The return trampoline's saved words named in another order (sys_uretprobe restores them so)."""
    saved = design.uretprobe.saved
    for i in range(len(saved) - 1):
        order = saved[:i] + (saved[i + 1], saved[i]) + saved[i + 2 :]
        yield f"uretprobe saved {saved} -> {order}", replace(design, uretprobe=replace(design.uretprobe, saved=order))


def ret_exit_trampoline(design: Design, _t: Target) -> Iterator[tuple[str, Design]]:
    """An IRET return's trampoline left to finish the return itself (SYSRET into code that has none)."""
    if Exit(design.uretprobe.exit) is Exit.IRET:
        yield "uretprobe exit iret -> trampoline", replace(design, uretprobe=replace(design.uretprobe, exit=Exit.TRAMPOLINE))


def ret_exit_iret(design: Design, _t: Target) -> Iterator[tuple[str, Design]]:
    """Equivalent: IRET straight to the caller from the saved registers, where the trampoline would
    have popped them and returned (the same state, another path)."""
    if Exit(design.uretprobe.exit) is Exit.TRAMPOLINE:
        yield "uretprobe exit trampoline -> iret", replace(design, uretprobe=replace(design.uretprobe, exit=Exit.IRET))


def _on_return(edit: Callable[..., Iterator[tuple[str, Design]]], edits_code: bool = True) -> Edit:
    """``edit`` applied to the uretprobe's return trampoline (nothing for one without a syscall);
    ``edits_code``: it takes the code to edit (else it changes ReturnTrampoline's other fields)."""
    def on_return(design: Design, target: Target) -> Iterator[tuple[str, Design]]:
        if RETURN.editable(design):
            yield from (edit(design, target, part=RETURN) if edits_code else edit(design, target))
    return on_return


OPERATORS: dict[str, tuple[Edit, bool]] = {  # name -> (the edit, equivalent)
    "drop-insn": (drop_insn, False),
    "swap-insns": (swap_insns, False),
    "change-immediate": (change_immediate, False),
    "lea-to-arith": (lea_to_arith, False),
    "stray-store": (stray_store, False),
    "set-flag": (set_flag, False),
    "clobber-gpr": (clobber_gpr, False),
    "clobber-vector": (clobber_vector, False),
    "clobber-control": (clobber_control, False),
    "unbalanced-stack": (unbalanced_stack, False),
    "drop-site-prefix": (drop_site_prefix, False),
    "saved-order": (saved_order, False),
    "off-by-eight": (off_by_eight, False),
    "sysret-for-iret": (wrong_exit, False),
    "missing-pop": (missing_pop, False),
    "ret-drop-insn": (_on_return(drop_insn), False),
    "ret-swap-insns": (_on_return(swap_insns), False),
    "ret-set-flag": (_on_return(set_flag), False),
    "ret-clobber-gpr": (_on_return(clobber_gpr), False),
    "ret-clobber-vector": (_on_return(clobber_vector), False),
    "ret-clobber-control": (_on_return(clobber_control), False),
    "ret-unbalanced-stack": (_on_return(unbalanced_stack), False),
    "ret-missing-pop": (_on_return(missing_pop), False),
    "ret-saved-order": (_on_return(ret_saved_order, edits_code=False), False),
    "ret-exit-trampoline": (_on_return(ret_exit_trampoline, edits_code=False), False),
    "deeper-lea": (deeper_lea, True),
    "leading-nop": (leading_nop, True),
    "one-more-saved": (one_more_saved, True),
    "ret-leading-nop": (_on_return(leading_nop), True),
    "ret-exit-iret": (_on_return(ret_exit_iret, edits_code=False), True),
}


def mutants(design: Design, target: Target, operators: list[str] | None = None) -> Iterator[Mutant]:
    """Every viable mutant of ``design`` (one the design API accepts), named after its base."""
    if not design.optimizes or design.trampoline is None or instructions(design.trampoline.code) is None:
        raise UsageError(f"design {design.name!r}: mutants are made of an optimizing design with its trampoline "
                         "as assembly text")
    n = 0
    for name in operators or list(OPERATORS):
        edit, equivalent = OPERATORS[name]
        for change, mutated in edit(design, target):
            n += 1
            candidate = _fitted(replace(mutated, name=f"{design.name}.m{n}", source=f"mutant of {design.name}"))
            try:
                candidate.validate()
            except DesignError:
                continue  # not viable: the design API refuses it before anything runs
            yield Mutant(name, change, candidate, equivalent)


def _fitted(design: Design) -> Design:
    """A 'slots' trampoline whose mutated code outgrew its slot gets bigger slots (where a slot
    lies changes nothing a program can see; the code in it is what is being tested)."""
    t = design.trampoline
    if t is None or t.layout is not Layout.SLOTS:
        return design
    try:
        size = len(t.code_bytes)
    except UsageError:
        return design  # keystone refuses it: validate() says so
    slot = t.slot_size
    while slot < size and slot < 256:
        slot *= 2
    return design if slot == t.slot_size else replace(design, trampoline=replace(t, slot_size=slot))


