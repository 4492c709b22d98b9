"""Assembling design code (trampolines, slots, patch prefixes) with keystone, loaded on first use.

Text is AT&T syntax, as kernel developers write it (`push %rcx; movq $336,%rax; syscall`).
keystone 0.9.2 reads every unprefixed number as hexadecimal once the AT&T option is set
(`$336` becomes 0x336), so decimal literals are rewritten to 0x form before assembling.
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING

from emu.errors import UsageError

if TYPE_CHECKING:
    import keystone

# A decimal literal standing alone: not part of a name (%r11, xmm0, label1) nor already hex (0x80).
_DECIMAL = re.compile(r"(?<![\w.$])(\$?)(-?)(\d+)(?![\w.:])")


class AsmError(UsageError):
    """Assembly text that keystone refuses."""


@functools.cache
def _ks() -> keystone.Ks:
    import keystone

    ks = keystone.Ks(keystone.KS_ARCH_X86, keystone.KS_MODE_64)
    ks.syntax = keystone.KS_OPT_SYNTAX_ATT
    return ks


def decimal_to_hex(text: str) -> str:
    """``$336`` -> ``$0x150``, ``-128(%rsp)`` -> ``-0x80(%rsp)``; names, registers and hex stay as they are."""
    return _DECIMAL.sub(lambda m: f"{m[1]}{m[2]}{int(m[3]):#x}", text)


@functools.cache
def assemble(text: str, address: int = 0) -> bytes:
    """Machine code for AT&T ``text`` (statements split by ``;`` or newlines) placed at ``address``."""
    source = decimal_to_hex(text)
    try:
        encoding, _count = _ks().asm(source, address)
    except Exception as err:  # keystone raises KsError, which is not importable without loading it
        raise AsmError(f"cannot assemble {text!r}: {err}") from None
    if not encoding:
        raise AsmError(f"{text!r} assembles to nothing")
    return bytes(encoding)
