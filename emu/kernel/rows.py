"""A syscall table's row and its handler: what dispatch.py reads to run a syscall and strace to print
it. The rows themselves are in table.py, which imports every handler module; the machine builds the
table and hands it to the Kernel, so dispatch.py (which the handlers import for their Kernel type)
imports none of them."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Handler = Callable[..., "int | None"]


class LazyHandler:
    """``emu.kernel.<module>.<name>``, imported on the first call and called directly from then on."""

    __slots__ = ("module", "name", "_fn")

    def __init__(self, module: str, name: str) -> None:
        self.module = module
        self.name = name
        self._fn: Handler | None = None

    def resolve(self) -> Handler:
        if self._fn is None:
            self._fn = getattr(importlib.import_module(f"emu.kernel.{self.module}"), self.name)
        return self._fn

    def __call__(self, *args: Any) -> int | None:
        return self.resolve()(*args)

    def __repr__(self) -> str:
        return f"<lazy emu.kernel.{self.module}.{self.name}>"


def lazy(module: str, name: str) -> LazyHandler:
    return LazyHandler(module, name)


@dataclass(frozen=True, slots=True)
class Row:
    nr: int
    name: str
    handler: Handler
    args: tuple[str, ...]
    note: str = ""
    raw: bool = False  # the handler reads and writes every register itself (no rax/rcx/r11 epilogue)
