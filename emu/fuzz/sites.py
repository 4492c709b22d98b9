"""The instructions a case can put under its probes: the probe site and the function's entry.

Raw encodings, so the exact bytes the kernel decides on are the ones the case names. The NOP5
forms are the ones ``is_nop5`` (emu/kernel/uprobes/sites.py, spec [NOPS]) accepts; the nop10
comes as libbpf emits it for USDT (``90`` then the 10-byte NOP, spec 3.8), so the probe lands
on the long NOP where the design optimizes it and on the ``90`` elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

from emu.errors import UsageError


@dataclass(frozen=True, slots=True)
class SiteForm:
    name: str
    code: bytes
    usdt_combo: bool = False  # the probe address is chosen like libbpf's nop combo
    weight: int = 1  # how often the generator picks it
    pushes: bool = False  # writes below sp: under a consumer that raised sp it would hit the return address


SITES: dict[str, SiteForm] = {
    s.name: s
    for s in (
        SiteForm("nop5", bytes.fromhex("0f1f440000"), weight=4),  # nopl 0(%rax,%rax,1): what compilers emit
        SiteForm("nop5-sib-rsp", bytes.fromhex("0f1f442400"), weight=1),  # nopl 0(%rsp)
        SiteForm("nop5-66", bytes.fromhex("660f1f4000"), weight=1),  # nopw 0(%rax)
        SiteForm("nop5-rexw", bytes.fromhex("480f1f4000"), weight=1),  # nopq 0(%rax)
        SiteForm("nop5-66x4-90", bytes.fromhex("6666666690"), weight=1),  # data16 x4 nop
        SiteForm("usdt-nop10", bytes.fromhex("90662e0f1f840000000000"), usdt_combo=True, weight=3),
        SiteForm("nop1", bytes.fromhex("90"), weight=2),
        SiteForm("push-rbx", bytes.fromhex("53"), pushes=True),  # emulated push: writes rsp-8 itself
        SiteForm("push-r12", bytes.fromhex("4154"), pushes=True),
        SiteForm("mov-rax-rbx", bytes.fromhex("4889d8"), weight=1),  # stepped out of line
        SiteForm("lea-rax-rbx16", bytes.fromhex("488d4310"), weight=1),
        SiteForm("lea-rip", bytes.fromhex("488d05f0ffffff"), weight=1),  # rip-relative: XOL with fixup
    )
}

ENTRIES: dict[str, bytes] = {
    "nop1": bytes.fromhex("90"),
    "nop2": bytes.fromhex("6690"),
    "nop5": bytes.fromhex("0f1f440000"),
}


def site_form(name: str) -> SiteForm:
    try:
        return SITES[name]
    except KeyError:
        raise UsageError(f"unknown site form {name!r} (known: {', '.join(SITES)})") from None


def entry_code(name: str) -> bytes:
    try:
        return ENTRIES[name]
    except KeyError:
        raise UsageError(f"unknown entry form {name!r} (known: {', '.join(ENTRIES)})") from None
