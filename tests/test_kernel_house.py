"""How the kernel package is laid out: the syscall table by number, no import cycles that run, and a
reason next to every import made inside a function.

These read the source (the import statements) and the table; each check has a negative control on a
small made-up package or table that breaks it."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from emu.kernel.rows import LazyHandler
from emu.kernel.table import ROWS

REPO = Path(__file__).resolve().parent.parent
KERNEL = REPO / "emu" / "kernel"


def by_number(nrs: list[int]) -> bool:
    """Strictly increasing: sorted, and no number bound twice."""
    return all(a < b for a, b in zip(nrs, nrs[1:], strict=False))


def test_the_syscall_table_reads_by_number() -> None:
    assert by_number([row.nr for row in ROWS])


def test_by_number_sees_a_row_out_of_place_or_twice() -> None:
    assert by_number([0, 1, 2, 435])
    assert not by_number([0, 2, 1])
    assert not by_number([0, 1, 1, 2])



def test_every_row_is_bound_to_a_function_of_a_kernel_module() -> None:
    """Lazy rows too: each names a module and a function that exist (resolving imports the module)."""
    for row in ROWS:
        fn = row.handler.resolve() if isinstance(row.handler, LazyHandler) else row.handler
        assert callable(fn) and fn.__module__.startswith("emu.kernel."), row.name


def test_a_lazy_row_naming_nothing_fails_to_resolve() -> None:
    with pytest.raises(AttributeError):
        LazyHandler("fs.names", "sys_no_such_call").resolve()
    with pytest.raises(ModuleNotFoundError):
        LazyHandler("fswrite", "sys_mkdir").resolve()

# ------------------------------------------------------------------------------- imports that run
def _module_name(root: Path, path: Path) -> str:
    top = root
    while (top.parent / "__init__.py").exists():
        top = top.parent
    parts = path.relative_to(top.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(tree: ast.Module) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import that runs (not under ``if TYPE_CHECKING``), and whether it is inside a function."""

    def walk(node: ast.AST, local: bool) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
        for child in ast.iter_child_nodes(node):
            if _is_type_checking(child):
                continue
            if isinstance(child, ast.Import | ast.ImportFrom):
                yield child, local
            yield from walk(child, local or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef))

    yield from walk(tree, False)


def _targets(node: ast.Import | ast.ImportFrom, modules: set[str]) -> set[str]:
    names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
    if isinstance(node, ast.ImportFrom):
        names += [f"{node.module}.{a.name}" for a in node.names]
    found = set()
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name:
            found.add(name)
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports when it runs (module level and inside functions)."""
    files = {_module_name(root, p): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        deps = set()
        for node, _local in _imports(ast.parse(path.read_text())):
            deps |= _targets(node, set(files))
        graph[name] = deps - {name, *_parents(name)}
    return graph


def _parents(name: str) -> list[str]:
    """A submodule's packages: importing them is the import system's doing, not a cycle."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                found.append(sorted([v, *component]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_kernel_package_has_no_import_cycle_that_runs() -> None:
    assert cycles(import_graph(KERNEL)) == []


def test_the_cycle_check_sees_a_cycle_through_a_function_local_import(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from pkg import c\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import b\n"
                              "import pkg.a\n")
    assert cycles(import_graph(pkg)) == [["pkg.a", "pkg.c", "pkg.sub.b"]]
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\n")
    assert cycles(import_graph(pkg)) == []  # a TYPE_CHECKING import never runs


# --------------------------------------------------------------- imports inside functions
def unexplained_local_imports(root: Path) -> list[str]:
    """Imports of the package's own modules made inside a function with no comment saying why,
    on the import's line or the line above it."""
    top = _module_name(root, root / "__init__.py").split(".")[0]
    found = []
    for path in sorted(root.rglob("*.py")):
        lines = path.read_text().splitlines()
        for node, local in _imports(ast.parse("\n".join(lines))):
            if not local or not any(name.split(".")[0] == top for name in _imported(node)):
                continue
            here, above = lines[node.lineno - 1], lines[node.lineno - 2]
            if "#" not in here and not above.lstrip().startswith("#"):
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def _imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    return [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]


def test_every_function_local_import_in_the_kernel_says_why() -> None:
    assert unexplained_local_imports(KERNEL) == []


def test_the_reason_check_sees_a_bare_local_import(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("import json\n\n\ndef f():\n    import json\n    from pkg import b  # b is slow to load\n"
                              "    # and so is c\n    from pkg import c\n    from pkg import d\n")
    assert unexplained_local_imports(pkg) == ["a.py:9"]  # stdlib and explained imports pass
