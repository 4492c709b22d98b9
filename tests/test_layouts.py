"""The structs C and Python share are declared once, in C: the extension exports where each field lies
(offsetof, and the size), and the Python side takes its word indices from there (hotpath.struct_layout),
or checks its typed ctypes mirror against them (hotpath.check_ctypes_layout)."""

from __future__ import annotations

import ctypes

import pytest
from conftest import built_extension

from emu import hotpath
from emu.cpu import pages
from emu.hotpath import edges, mem_filter, repeats, store_watch, write_log

EXTENSION = built_extension("LAYOUTS")
needs_extension = pytest.mark.skipif(EXTENSION is None, reason="the C extension is not built")


@needs_extension
def test_every_shared_struct_is_exported_and_read_from_the_export() -> None:
    assert EXTENSION is not None
    exported = EXTENSION.LAYOUTS
    assert set(exported) == {"page_table", "mem_filter", "write_log", "store_watch", "watch_record", "watch_op",
                             "edges", "repeats", "icount_state"}
    assert exported["page_table"]["fills"] // 8 == pages.FILLS and exported["page_table"]["armed"] // 8 == pages.ARMED
    assert exported["mem_filter"]["ranges"] // 8 == mem_filter.HEADER_WORDS
    assert exported["write_log"]["entries"] == write_log.ENTRIES_OFFSET
    assert exported["watch_record"]["sizeof"] // 8 == store_watch.RECORD_WORDS
    assert exported["edges"]["watch"] // 8 == edges.WATCH and exported["edges"]["sizeof"] == edges.START
    assert exported["repeats"]["hits"] // 8 == repeats.HITS


def test_without_the_extension_python_lays_the_fields_out_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hotpath, "LAYOUTS", {})
    layout = hotpath.struct_layout("made_up", [("a", 8), ("b", 16), ("c", 0)])
    assert layout == {"a": 0, "b": 8, "c": 24, "sizeof": 24}
    assert hotpath.words(layout, "b c") == (1, 3)


def test_a_field_the_extension_lacks_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The negative control: Python names a field the C struct does not have (an extension of another source)."""
    monkeypatch.setattr(hotpath, "LAYOUTS", {"made_up": {"a": 0, "b": 16, "sizeof": 24}})
    assert hotpath.struct_layout("made_up", [("a", 8), ("b", 8)])["b"] == 16  # C's offsets win over the order
    with pytest.raises(hotpath.LayoutError, match="struct made_up of the C extension has no c"):
        hotpath.struct_layout("made_up", [("a", 8), ("c", 8)])


class _Mirror(ctypes.Structure):
    _fields_ = [("a", ctypes.c_uint64), ("b", ctypes.c_uint32), ("c", ctypes.c_uint32)]


def test_a_ctypes_mirror_laid_out_otherwise_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hotpath, "LAYOUTS", {"mirror": {"a": 0, "b": 8, "c": 12, "sizeof": 16}})
    hotpath.check_ctypes_layout("mirror", _Mirror)
    monkeypatch.setattr(hotpath, "LAYOUTS", {"mirror": {"a": 0, "b": 12, "c": 8, "sizeof": 16}})
    with pytest.raises(hotpath.LayoutError, match="b, c"):
        hotpath.check_ctypes_layout("mirror", _Mirror)
    monkeypatch.setattr(hotpath, "LAYOUTS", {"mirror": {"first": 0, "sizeof": 16}})
    hotpath.check_ctypes_layout("mirror", _Mirror, {"a": "first"})


# ------------------------------------------------------------------ enum values
@needs_extension
def test_the_enum_values_python_encodes_are_the_extension_s() -> None:
    from emu.hotpath import store_watch as watch
    from emu.kernel.uprobes.consumers import NATIVE_PATHS
    from emu.kernel.uprobes.plan import EXIT_KINDS

    assert EXTENSION is not None
    enums = EXTENSION.ENUMS
    assert NATIVE_PATHS.index("call") == enums["PATH_CALL"]
    assert [kind.value for kind in EXIT_KINDS].index("iret") == enums["EXIT_IRET"]
    assert edges.KERNEL_EXITS.index(None) == enums["EDGES_EXIT_NONE"] and enums["EDGES_ARMED"] == edges.ARMED
    from emu.cpu import Reg
    from emu.hotpath.front import FRONT_REGS
    from emu.kernel.uprobes.fastpath import STAT_ORDER

    assert FRONT_REGS.index(Reg.RSP) == enums["REG_SP"] and STAT_ORDER[-1] == enums["ST_RET_HITS"]
    ours = (watch.KNOWN, watch.T_MEM, watch.NO_EXITS, repeats.SLOTS)
    assert ours == (enums["WATCH_KNOWN"], enums["WATCH_T_MEM"], enums["WATCH_RANGE_NO_EXITS"], enums["REPEAT_SLOTS"])


def test_constants_come_from_the_extension_and_a_missing_one_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hotpath, "_BUILT", object())
    monkeypatch.setattr(hotpath, "ENUMS", {"B_FIRST": 0, "A_SECOND": 1})
    assert hotpath.constant("A_SECOND", 7) == 1
    assert hotpath.in_c_order({"a": "A_SECOND", "b": "B_FIRST"}) == ("b", "a")  # C's order, not the dict's
    with pytest.raises(hotpath.LayoutError, match="no constant C_THIRD"):
        hotpath.constant("C_THIRD", 2)
    monkeypatch.setattr(hotpath, "ENUMS", {"B_FIRST": 0, "A_SECOND": 2})
    with pytest.raises(hotpath.LayoutError, match="not 0..1"):
        hotpath.in_c_order({"a": "A_SECOND", "b": "B_FIRST"})
    monkeypatch.setattr(hotpath, "_BUILT", None)
    assert hotpath.constant("C_THIRD", 2) == 2  # without the extension: Python's own value
