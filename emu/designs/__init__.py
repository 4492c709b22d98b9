"""Kernel designs as data: the public API for the built-in designs and for users' own (DESIGN.md, spec 1-5).

A design names its mechanisms and their parameters; the fake kernel implements each mechanism
once (emu/kernel/uprobes/) and reads the parameters from here:

- ``Patch``: which long NOP a site must be to be optimized, the bytes written over it (an optional
  code prefix, then a call or jmp rel32), the order of the writes, and what detach leaves behind.
- ``Trampoline``: the code the patched site reaches, and how its pages are laid out and shared.
- ``Handler``: what sys_uprobe does: which words it reads from the user stack, how it finds the
  probe, and how it returns (into the trampoline by SYSRET, or straight back by IRET or SYSRET).
- ``ReturnTrampoline``: the uretprobe trampoline in [uprobes] slot 0 and its syscall, if any.

Code is AT&T assembly text (assembled with keystone on first use) or bytes. ``Design.validate()``
refuses an inconsistent design with a message naming the problem, before anything runs.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import re
from dataclasses import dataclass, field

from emu.abi import NR_UPROBE, NR_URETPROBE, NR_URETPROBE_RFC, PAGE_SIZE, RED_ZONE
from emu.designs.choices import Branch as Branch  # the choices are part of this API: re-exported
from emu.designs.choices import Detach as Detach
from emu.designs.choices import Exit as Exit
from emu.designs.choices import Layout as Layout
from emu.designs.choices import ProbeFrom as ProbeFrom
from emu.designs.choices import SiteForm as SiteForm
from emu.designs.choices import WriteOrder as WriteOrder
from emu.designs.choices import coerce_choices
from emu.errors import UsageError

Code = str | bytes


SITE_LENGTH: dict[str, int] = {SiteForm.NOP5: 5, SiteForm.NOP10: 10}
BRANCH_OPCODE: dict[str, int] = {Branch.CALL: 0xE8, Branch.JMP: 0xE9}
SAVABLE = ("ax", "bx", "cx", "dx", "si", "di", "bp", "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15", "flags")
XOL_SLOT_BYTES = 128  # UPROBE_XOL_SLOT_BYTES (spec 4.3)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")


class DesignError(UsageError):
    """A design that cannot run as written."""


def code_bytes(code: Code) -> bytes:
    if isinstance(code, bytes):
        return code
    from emu.asm import assemble

    return assemble(code)


def syscall_ends(code: bytes) -> list[int]:
    """Offsets just after each `syscall` instruction in ``code`` (linear disassembly)."""
    from emu.disasm import cs64

    return [addr + size for addr, size, mnemonic, _ in cs64().disasm_lite(code, 0) if mnemonic == "syscall"]


def loads_rax(code: bytes, nr: int) -> bool:
    """Does ``code`` move the immediate ``nr`` into eax or rax before its first syscall?"""
    from emu.disasm import cs64

    for _addr, _size, mnemonic, ops in cs64().disasm_lite(code, 0):
        if mnemonic == "syscall":
            return False
        target, _, value = ops.partition(", ")
        if mnemonic == "mov" and target in ("eax", "rax") and _immediate(value) == nr:
            return True
    return False


def _immediate(text: str) -> int | None:
    try:
        return int(text, 0)
    except ValueError:
        return None  # a register or memory operand


@dataclass(frozen=True)
class Patch:
    """How an optimizable site is rewritten after its first INT3 hit (spec 3.3, 3.5, 3.8)."""

    site: SiteForm | str = SiteForm.NOP5  # the long NOP this design optimizes
    prefix: Code = b""  # code placed before the branch (nop10: `lea -0x80(%rsp),%rsp` steps over the red zone)
    branch: Branch | str = Branch.CALL  # rel32 to the trampoline, or to this probe's slot
    write_order: WriteOrder | str = WriteOrder.INT3_FIRST  # spec 3.5; front-to-back exposes torn insns
    detach: Detach | str = Detach.RESTORE  # original bytes, or `eb rel8` over the stale tail (spec 3.8)

    def __post_init__(self) -> None:
        coerce_choices(self, site=SiteForm, branch=Branch, write_order=WriteOrder, detach=Detach)

    @property
    def length(self) -> int:
        return SITE_LENGTH[self.site]

    @property
    def branch_end(self) -> int:
        """Offset of the branch's end (a call's return address) from the site (6.18: 5; nop10: lea 5 + call 5)."""
        return len(self.prefix_bytes) + 5

    @functools.cached_property
    def prefix_bytes(self) -> bytes:
        return code_bytes(self.prefix) if self.prefix else b""

    def problems(self) -> list[str]:
        if self.site not in SITE_LENGTH:
            return [f"patch.site {self.site!r} is not one of {', '.join(SITE_LENGTH)}"]
        found = _choice("patch.branch", self.branch, BRANCH_OPCODE) + \
            _choice("patch.write_order", self.write_order, WriteOrder) + \
            _choice("patch.detach", self.detach, Detach)
        size = self.branch_end
        if size > self.length:
            found.append(f"patch is {size} bytes ({len(self.prefix_bytes)}-byte prefix + 5-byte {self.branch} rel32), "
                         f"longer than its {self.length}-byte {self.site} site")
        return found


class _Assembled:
    """A design part with code of its own, assembled on first use."""

    code: Code

    @functools.cached_property
    def code_bytes(self) -> bytes:
        return code_bytes(self.code)


@dataclass(frozen=True)
class Trampoline(_Assembled):
    """The code a patched site reaches and how its pages are placed (spec 1.3, 3.4)."""

    code: Code
    layout: Layout | str = Layout.SHARED  # shared: one page for every site in rel32 reach; slots: one each
    slot_size: int = 16  # slots: bytes per slot; a page holds PAGE_SIZE // slot_size of them
    slot_reuse: bool = False  # slots: hand a detached probe's slot to the next probe (the race the permanent rule avoids)
    inherited_on_fork: bool = True  # False: VM_DONTCOPY, as 6.18's [uprobes-trampoline] (linux-6.18-observed.md)

    def __post_init__(self) -> None:
        coerce_choices(self, layout=Layout)

    @functools.cached_property
    def syscall_return(self) -> int:
        """Offset of the instruction after the trampoline's syscall: regs->ip inside sys_uprobe."""
        return syscall_ends(self.code_bytes)[0]

    @property
    def slots_per_page(self) -> int:
        return PAGE_SIZE // self.slot_size

    def problems(self, nr: int | None) -> list[str]:
        found = _choice("trampoline.layout", self.layout, Layout)
        size = len(self.code_bytes)
        slots = self.layout is Layout.SLOTS
        room = self.slot_size if slots else PAGE_SIZE
        where = f"its {self.slot_size}-byte slot" if slots else f"a {PAGE_SIZE}-byte page"
        if slots and not (0 < self.slot_size <= PAGE_SIZE and PAGE_SIZE % self.slot_size == 0):
            found.append(f"trampoline.slot_size {self.slot_size} does not divide a {PAGE_SIZE}-byte page")
        elif size > room:
            found.append(f"trampoline code is {size} bytes, does not fit {where}")
        ends = syscall_ends(self.code_bytes)
        if len(ends) != 1:
            found.append(f"trampoline has {len(ends)} syscall instructions, needs exactly one (sys_uprobe's entry)")
        elif nr is not None and not loads_rax(self.code_bytes, nr):
            found.append(f"trampoline does not load syscall number {nr} into rax before its syscall")
        return found


@dataclass(frozen=True)
class Handler:
    """sys_uprobe: the steps the kernel takes when a trampoline's syscall arrives (spec 2.1)."""

    nr: int = NR_UPROBE
    saved: tuple[str, ...] = ("ax", "r11", "cx")  # words the trampoline pushed, from rsp upward, restored into regs
    saved_offset: int = 0  # bytes between rsp at the syscall and the first saved word
    probe_from: ProbeFrom | str = ProbeFrom.RETURN_ADDRESS  # the call's return address, or which slot
    sp_skip: int = 0  # bytes the site or slot moved rsp down before the pushes, undone on the way back
    exit: Exit | str = Exit.TRAMPOLINE
    # trampoline: write the words back and SYSRET into the trampoline, whose pops and ret restore them (6.18);
    # iret: restore everything and IRET to the instruction after the site;
    # sysret: restore, then rcx = ip and r11 = flags, and SYSRET straight to the instruction after the site.
    outside_errno: int = errno.ENXIO  # returned to a call from anywhere but a trampoline (spec 2.1 step 1)

    def __post_init__(self) -> None:
        coerce_choices(self, probe_from=ProbeFrom, exit=Exit)

    def problems(self) -> list[str]:
        found = _saved_problems("handler.saved", self.saved)
        found += _choice("handler.probe_from", self.probe_from, ProbeFrom)
        found += _choice("handler.exit", self.exit, Exit)
        if self.exit is Exit.TRAMPOLINE and self.probe_from is not ProbeFrom.RETURN_ADDRESS:
            found.append("handler.exit 'trampoline' returns through the call's return address: needs "
                         "probe_from='return-address'")
        for what, value in (("sp_skip", self.sp_skip), ("saved_offset", self.saved_offset)):
            if value % 8 or not 0 <= value <= PAGE_SIZE:
                found.append(f"handler.{what} {value} must be a multiple of 8 in [0, {PAGE_SIZE}]")
        if not 0 < self.outside_errno < 4096:
            found.append(f"handler.outside_errno {self.outside_errno} is not an errno")
        return found


@dataclass(frozen=True)
class ReturnTrampoline(_Assembled):
    """The uretprobe trampoline at [uprobes] slot 0 (spec 1.4, 2.2, 5.2)."""

    code: Code = "int3"
    nr: int | None = None  # its syscall; None: the trampoline traps and the INT3 path handles the return
    saved: tuple[str, ...] = ("r11", "cx", "ax")  # words it pushed, from rsp upward
    exit: Exit | str = Exit.TRAMPOLINE  # SYSRET into its pops and ret (2.2), or IRET to the caller (not SYSRET)

    def __post_init__(self) -> None:
        coerce_choices(self, exit=Exit)

    @functools.cached_property
    def syscall_return(self) -> int:
        """Offset after the syscall (the kernel's trampoline_check_ip); 0 for the INT3 trampoline."""
        return syscall_ends(self.code_bytes)[0] if self.nr is not None else 0

    def problems(self) -> list[str]:
        found: list[str] = []
        code = self.code_bytes
        if len(code) > XOL_SLOT_BYTES:
            found.append(f"uretprobe trampoline is {len(code)} bytes, does not fit a {XOL_SLOT_BYTES}-byte XOL slot")
        if self.nr is None:
            if code[:1] != b"\xcc":
                found.append("a uretprobe trampoline without a syscall must start with int3")
            return found
        found += _saved_problems("uretprobe.saved", self.saved)
        found += _choice("uretprobe.exit", self.exit, (Exit.TRAMPOLINE, Exit.IRET))
        if len(syscall_ends(code)) != 1:
            found.append("uretprobe trampoline needs exactly one syscall instruction")
        elif not loads_rax(code, self.nr):
            found.append(f"uretprobe trampoline does not load syscall number {self.nr} into rax before its syscall")
        if self.exit is Exit.TRAMPOLINE and self.saved[-1:] != ("ax",):
            found.append("uretprobe.exit 'trampoline' writes the return address over the last saved word, "
                         "which must be 'ax' (the syscall returns it)")
        return found


@dataclass(frozen=True)
class Design:
    """One kernel design. ``patch``, ``trampoline`` and ``handler`` come together or not at all (INT3 only)."""

    name: str
    source: str = "user design"
    patch: Patch | None = None
    trampoline: Trampoline | None = None
    handler: Handler | None = None
    uretprobe: ReturnTrampoline = field(default_factory=ReturnTrampoline)

    @property
    def optimizes(self) -> bool:
        return self.patch is not None

    @property
    def site_length(self) -> int:
        return self.patch.length if self.patch is not None else 5

    def problems(self) -> list[str]:
        """Everything inconsistent in this design (empty: it can run). Types and sizes come first:
        nothing is assembled or disassembled until every field has the right type and fits."""
        shape = shape_problems(self)
        if shape:
            return shape
        found = [] if _NAME.match(self.name) else [f"design name {self.name!r} must be letters, digits, - _ . +"]
        parts = {"patch": self.patch, "trampoline": self.trampoline, "handler": self.handler}
        missing = [k for k, v in parts.items() if v is None]
        if missing and len(missing) < 3:
            present = [k for k in parts if k not in missing]
            found.append(f"has {' and '.join(present)} but no {' and '.join(missing)}: an optimizing design needs "
                         "patch, trampoline and handler")
        try:
            found += self._part_problems()
        except UsageError as err:  # assembly text keystone refuses
            found.append(str(err))
        return found

    def _part_problems(self) -> list[str]:
        found = self.uretprobe.problems()
        if self.patch is None or self.trampoline is None or self.handler is None:
            return found
        found += self.patch.problems() + self.trampoline.problems(self.handler.nr) + self.handler.problems()
        slots, by_slot = self.trampoline.layout is Layout.SLOTS, self.handler.probe_from is ProbeFrom.SLOT
        if slots != by_slot:
            found.append("a 'slots' trampoline and handler.probe_from='slot' go together")
        if self.handler.probe_from is ProbeFrom.RETURN_ADDRESS and self.patch.branch is not Branch.CALL:
            found.append("handler.probe_from='return-address' needs patch.branch='call' (a jmp pushes no return address)")
        if self.uretprobe.nr == self.handler.nr:
            found.append(f"sys_uprobe and the uretprobe syscall both use number {self.handler.nr}")
        return found

    def validate(self) -> Design:
        found = self.problems()
        if found:
            raise DesignError(f"design {self.name!r}: " + "; ".join(found))
        return self


# Where code must fit, in bytes (spec 3.3, 4.3); code longer than MAX_CODE_TEXT is refused unread.
CODE_ROOM = {("Patch", "prefix"): 10, ("Trampoline", "code"): PAGE_SIZE, ("ReturnTrampoline", "code"): XOL_SLOT_BYTES}
MAX_CODE_TEXT = 64 * 1024
PARTS = {"patch": "Patch", "trampoline": "Trampoline", "handler": "Handler", "uretprobe": "ReturnTrampoline"}


def _type_problem(what: str, annotation: str, value: object) -> str | None:
    """Does ``value`` have the type the field's annotation names? (The message says what it wanted.)"""
    if annotation == "Code":
        if isinstance(value, bytes | str):
            return None
        wanted = "assembly text (str) or bytes"
    elif annotation in ("int", "int | None"):
        if isinstance(value, int) and not isinstance(value, bool) or (value is None and "None" in annotation):
            return None
        wanted = "an int" + (" or None" if "None" in annotation else "")
    elif annotation == "bool":
        if isinstance(value, bool):
            return None
        wanted = "True or False"
    elif annotation.startswith("tuple[str"):
        if isinstance(value, tuple | list) and all(isinstance(v, str) for v in value):
            return None
        wanted = "a tuple of register names"
    else:  # str, SiteForm and the Literal choices
        if isinstance(value, str):
            return None
        wanted = "a str"
    return f"{what} must be {wanted}, not {type(value).__name__} {_short(value)}"


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _code_size_problem(what: str, room: int, code: str | bytes) -> str | None:
    """Code far too big to read at all (the exact fit is checked later, on the assembled bytes)."""
    if len(code) <= MAX_CODE_TEXT:
        return None
    unit = "characters of assembly" if isinstance(code, str) else "bytes"
    return f"{what} is {len(code)} {unit}, more than {MAX_CODE_TEXT} (it must fit {room} bytes)"


def shape_problems(design: object) -> list[str]:
    """Wrong types and oversized code in a design, found without assembling anything."""
    if not isinstance(design, Design):
        return [f"not a Design: {type(design).__name__}"]
    found = [] if isinstance(design.name, str) else [f"design name must be a str, not {type(design.name).__name__}"]
    for attr, cls in PARTS.items():
        part = getattr(design, attr)
        if part is None and attr != "uretprobe":
            continue
        if type(part).__name__ != cls:
            found.append(f"{attr} must be a {cls}{' or None' if attr != 'uretprobe' else ''}, not {type(part).__name__}")
            continue
        for f in dataclasses.fields(part):
            value = getattr(part, f.name)
            problem = _type_problem(f"{attr}.{f.name}", str(f.type), value)
            room = CODE_ROOM.get((cls, f.name))
            if problem is None and room is not None:
                problem = _code_size_problem(f"{attr}.{f.name}", room, value)
            if problem is not None:
                found.append(problem)
    return found


def _choice(what: str, value: object, allowed: object) -> list[str]:
    options = list(allowed)  # type: ignore[call-overload]
    return [] if value in options else [f"{what} {value!r} is not one of {', '.join(map(str, options))}"]


def _saved_problems(what: str, saved: tuple[str, ...]) -> list[str]:
    bad = [r for r in saved if r not in SAVABLE]
    if bad:
        return [f"{what} names {', '.join(map(repr, bad))}, not a saved register ({', '.join(SAVABLE)})"]
    if len(set(saved)) != len(saved):
        return [f"{what} names a register twice"]
    return []


# ----------------------------------------------------------------------------------------- built-in designs
# 6.18 [uprobes-trampoline] (spec 1.3): saves rcx/r11/rax, calls 336, pops, returns to the site's next insn.
NOP5_TRAMPOLINE = "push %rcx; push %r11; push %rax; movq $336,%rax; syscall; pop %rax; pop %r11; pop %rcx; ret; int3"
# spec 1.5: the same, its `ret $0x80` also undoing the site's lea over the red zone.
NOP10_TRAMPOLINE = "push %rcx; push %r11; push %rax; movq $336,%rax; syscall; pop %rax; pop %r11; pop %rcx; ret $128; int3"
# The red-zone fix: a 16-byte slot per probe that steps below the red zone before pushing.
JMP_SLOT = "lea -128(%rsp),%rsp; push %rcx; push %r11; push %rax; mov $336,%eax; syscall"
URETPROBE_335 = ReturnTrampoline("push %rax; push %rcx; push %r11; movq $335,%rax; syscall; pop %r11; pop %rcx; ret; int3",
                                 nr=NR_URETPROBE)  # spec 1.4
URETPROBE_RFC = ReturnTrampoline("push %rax; push %rcx; push %r11; movq $462,%rax; syscall; int3",
                                 nr=NR_URETPROBE_RFC, exit="iret")
URETPROBE_INT3 = ReturnTrampoline()

BUILTIN: tuple[Design, ...] = (
    Design("int3", "Linux <= 6.10", uretprobe=URETPROBE_INT3),
    Design("uretprobe-rfc", "RFC 'uprobe: Add uretprobe syscall to speed up return probe' (syscall 462)",
           uretprobe=URETPROBE_RFC),
    Design("linux-6.18", "mainline 6.18",
           Patch("nop5", branch="call"), Trampoline(NOP5_TRAMPOLINE, inherited_on_fork=False),
           Handler(saved=("ax", "r11", "cx"), outside_errno=errno.ENXIO), URETPROBE_335),
    Design("jmp-slots", "'uprobes/x86: Fix red zone clobbering in nop5 optimization' (May 2026)",
           Patch("nop5", branch="jmp"), Trampoline(JMP_SLOT, layout="slots", slot_size=16),
           # (the patch maps one page built at boot into each process; it does not say VM_DONTCOPY: inherited)
           Handler(saved=("ax", "r11", "cx"), probe_from="slot", sp_skip=RED_ZONE, exit="iret",
                   outside_errno=errno.EPROTO), URETPROBE_335),
    Design("nop10", "nop10 alternative (LATE10/WIP10)",
           Patch("nop10", prefix="lea -128(%rsp),%rsp", branch="call", detach="jump-over"),
           Trampoline(NOP10_TRAMPOLINE),  # LATE10 drops VM_DONTCOPY (spec 3.4)
           Handler(saved=("ax", "r11", "cx"), sp_skip=RED_ZONE, outside_errno=errno.EPROTO), URETPROBE_335),
)
DESIGNS: dict[str, Design] = {d.name: d for d in BUILTIN}
DEFAULT_DESIGN = "linux-6.18"
_user_designs: dict[str, Design] = {}
_user_design_files: dict[str, str] = {}  # name -> the file that defined it


def register(design: Design, path: str | None = None) -> Design:
    """Make a user design known by name to every command (validated first; replaces an earlier user design
    of the same name). ``path``: the design file it comes from, for commands that must name it again."""
    design.validate()
    if design.name in DESIGNS:
        raise DesignError(f"design name {design.name!r} is built in; pick another")
    _user_designs[design.name] = design
    if path is not None:
        _user_design_files[design.name] = path
    return design


def design_file_of(name: str) -> str | None:
    """The design file a registered user design came from (None: built in, or registered in code)."""
    return _user_design_files.get(name) if name in _user_designs else None


@functools.cache
def _validated(design: Design) -> Design:
    """validate(), once per distinct design (a Machine is built per run; the fuzzer builds many)."""
    return design.validate()


def forget_user_designs() -> None:
    """Drop every registered user design (tests; a long-lived process loading new files)."""
    _user_designs.clear()
    _user_design_files.clear()


def known_designs() -> dict[str, Design]:
    """Built-in designs, then the user's, by name."""
    return {**DESIGNS, **_user_designs}


def get_design(name: str | Design) -> Design:
    if isinstance(name, Design):
        return name if any(name is d for d in BUILTIN) else _validated(name)
    try:
        return known_designs()[name]
    except KeyError:
        raise UsageError(f"unknown kernel design {name!r} (known: {', '.join(known_designs())})") from None
