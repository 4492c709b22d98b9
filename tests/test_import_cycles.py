"""The import graph of emu's own modules, read from the source with ``ast``: every import counts,
those under ``if TYPE_CHECKING:`` and those inside functions included (a cycle hidden behind a
function-local import is still a knot a reader has to untie). It has no cycle, and no import goes
from a lower layer up to a higher one (LAYERS)."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

EMU = Path(__file__).resolve().parent.parent / "emu"

# Building and running a process (emu/machine.py's neighbourhood): none of these is in a cycle.
PROCESS_MODULES = frozenset({
    "emu.machine", "emu.runtypes", "emu.process.loading", "emu.attach", "emu.libprobes", "emu.process.runloop",
})

# Cycles outside the process modules that the source still has (none now). The check below is a
# ratchet: a knot may shrink or go, never grow or appear (drop an entry here once its cycle is gone).
KNOWN_KNOTS: tuple[frozenset[str], ...] = ()


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules_under(root: Path) -> dict[str, Path]:
    return {module_name(path, root): path for path in sorted(root.rglob("*.py"))}


def imported(tree: ast.AST, here: str, is_package: bool, known: Iterable[str]) -> set[str]:
    """The package's modules ``tree`` imports anywhere in its body (a ``from P import N`` names the
    module P.N when there is one, else P itself)."""
    names = set(known)
    top = next(iter(names)).split(".")[0] if names else ""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here.split(".") if is_package else here.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in names else base)
    return {name for name in found if name in names and name.split(".")[0] == top and name != here}


def import_graph(root: Path) -> dict[str, set[str]]:
    modules = modules_under(root)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        graph[name] = imported(tree, name, path.name == "__init__.py", modules)
    return graph


def knots(graph: Mapping[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[frozenset[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, list[str]]] = [(start, sorted(graph[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            if targets:
                nxt = targets.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph.get(nxt, ()))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def describe(found: Iterable[frozenset[str]]) -> str:
    return "\n".join("  " + " <-> ".join(sorted(knot)) for knot in found) or "  (none)"


def test_process_modules_are_in_no_cycle() -> None:
    graph = import_graph(EMU)
    assert graph.keys() >= PROCESS_MODULES, sorted(PROCESS_MODULES - graph.keys())
    tangled = [knot for knot in knots(graph) if knot & PROCESS_MODULES]
    assert not tangled, "import cycles through the process modules:\n" + describe(tangled)


def test_no_new_cycle_in_emu() -> None:
    found = knots(import_graph(EMU))
    grown = [knot for knot in found if not any(knot <= old for old in KNOWN_KNOTS)]
    assert not grown, "import cycles among emu modules (the whole graph's):\n" + describe(found)


def test_the_kernel_object_imports_no_syscall_handler() -> None:
    """dispatch.py's Kernel gets its table from the machine and its state from state.py and family.py."""
    graph = import_graph(EMU)
    assert "emu.kernel.table" not in graph["emu.kernel.dispatch"]
    assert "emu.kernel.dispatch" not in graph["emu.kernel.state"] | graph["emu.kernel.family"] | graph["emu.kernel.rows"]
    assert not graph["emu.kernel.dispatch"] & {"emu.kernel.fork", "emu.kernel.signal", "emu.kernel.mm"}


def test_machine_libprobes_edge_goes_one_way() -> None:
    graph = import_graph(EMU)
    assert "emu.machine" not in graph["emu.libprobes"]
    assert "emu.attach" not in graph["emu.libprobes"]


# ------------------------------------------------------------------ layers
# emu's layers, lowest first: a module may import from its own layer and the ones below, never from
# one above. A module belongs to the layer of the longest prefix that names it ("emu.hotpath" is the
# package's loader alone, "emu.hotpath." its modules).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundation", ("emu", "emu.errors", "emu.abi", "emu.asm", "emu.disasm", "emu.render", "emu.violations",
                    "emu.designs", "emu.hotpath", "emu.kernel.errno_")),
    ("engine", ("emu.cpu",)),
    ("hot path", ("emu.hotpath.",)),
    ("process image", ("emu.cpumodel", "emu.process.elf", "emu.process.layout", "emu.process.memory", "emu.process.vma",
                       "emu.process.loader", "emu.process.initstack", "emu.process.scripts", "emu.process.icount")),
    ("kernel", ("emu.kernel",)),
    ("process", ("emu.process", "emu.callret", "emu.guestio", "emu.runtypes", "emu.probes", "emu.libprobes", "emu.attach",
                 "emu.machine", "emu.ifunc")),
    ("analysis", ("emu.verify", "emu.lockstep", "emu.check", "emu.scan", "emu.diff", "emu.patchview", "emu.bench",
                  "emu.fuzz", "emu.race", "emu.survey", "emu.mutation", "emu.report", "emu.native", "emu.dist")),
    ("front", ("emu.cli", "emu.commands", "emu.pytest_plugin", "emu.__main__")),
)


def layer_of(module: str, layers: tuple[tuple[str, tuple[str, ...]], ...] = LAYERS) -> int | None:
    """The index of ``module``'s layer (None: no layer names it)."""
    best: tuple[int, int] | None = None
    for index, (_name, prefixes) in enumerate(layers):
        for prefix in prefixes:
            named = module == prefix or module.startswith(prefix if prefix.endswith(".") else prefix + ".")
            if named and (best is None or len(prefix) > best[1]):
                best = (index, len(prefix))
    return best[0] if best else None


def upward_edges(graph: Mapping[str, set[str]], layers: tuple[tuple[str, tuple[str, ...]], ...] = LAYERS) -> list[str]:
    found = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            here, there = layer_of(module, layers), layer_of(target, layers)
            if here is not None and there is not None and there > here:
                found.append(f"{module} ({layers[here][0]}) -> {target} ({layers[there][0]})")
    return found


def test_every_module_has_a_layer() -> None:
    assert [module for module in import_graph(EMU) if layer_of(module) is None] == []


def test_no_import_goes_up_a_layer() -> None:
    assert upward_edges(import_graph(EMU)) == []


def test_an_import_up_a_layer_is_found(tmp_path: Path) -> None:
    root = write_package(tmp_path, {"__init__.py": "", "low.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                    "    from pkg.high import H\n", "high.py": "import pkg.low\n"})
    layers = (("low", ("pkg", "pkg.low")), ("high", ("pkg.high",)))
    assert upward_edges(import_graph(root), layers) == ["pkg.low (low) -> pkg.high (high)"]


# ----------------------------------------------------------- negative controls: the reader finds knots

def write_package(tmp_path: Path, files: Mapping[str, str]) -> Path:
    root = tmp_path / "pkg"
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.mark.parametrize("a_text, b_text", [
    ("import pkg.b\n", "from pkg import a\n"),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n", "from pkg.a import A\n"),
    ("def f():\n    from pkg.b import g\n    return g\n", "from pkg.a import f\n"),
    ("from .b import g\n", "from . import a\n"),
])
def test_a_cycle_is_found_however_it_is_imported(tmp_path: Path, a_text: str, b_text: str) -> None:
    root = write_package(tmp_path, {"__init__.py": "", "a.py": a_text, "b.py": b_text, "c.py": "import pkg.a\n"})
    assert knots(import_graph(root)) == [frozenset({"pkg.a", "pkg.b"})]


def test_a_chain_is_not_a_cycle(tmp_path: Path) -> None:
    root = write_package(tmp_path, {
        "__init__.py": "", "a.py": "import pkg.b\nimport os\n", "b.py": "from pkg.sub import c\n",
        "sub/__init__.py": "", "sub/c.py": "import json\n",
    })
    graph = import_graph(root)
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.sub.c"}
    assert knots(graph) == []


def test_a_long_cycle_is_one_knot(tmp_path: Path) -> None:
    root = write_package(tmp_path, {
        "__init__.py": "", "a.py": "import pkg.b\n", "b.py": "import pkg.c\n", "c.py": "import pkg.a\n",
        "d.py": "import pkg.a\n",
    })
    assert knots(import_graph(root)) == [frozenset({"pkg.a", "pkg.b", "pkg.c"})]


if __name__ == "__main__":  # python tests/test_import_cycles.py: every cycle in emu's import graph today
    print(describe(knots(import_graph(EMU))))
