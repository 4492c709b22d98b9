"""The repository explains itself: every file a comment or a document names exists, every
``Class.attribute`` a comment or docstring names is one, and every section of the kernel's behaviour
the code cites ("spec N.M", "docs/NAME.md section N") is in docs/, and nothing cites a document
outside the repository; no module is over 500 lines.
Each check also has its negative control: a made-up flaw that it reports."""

from __future__ import annotations

import ast
import glob
import io
import re
import subprocess
import tokenize
from pathlib import Path

import pytest
from conftest import REPO

PATH = re.compile(r"(?<![\w/.-])((?:emu|tests|benchmarks|fixtures|elf_samples|docs|\.ci)/[\w./*-]*[\w*])")
CLASS_ATTRIBUTE = re.compile(r"\b([A-Z][A-Za-z0-9]+)\.(_{0,2}[a-z][a-z0-9_]*)\b")
# Where the project names its own files for readers (tests name made-up paths as test data).
NAMING_FILES = ("emu/", "benchmarks/", "docs/", "fixtures/", "README.md", ".ci/run", "pyproject.toml", "tox.ini")
TEXT_SUFFIXES = (".py", ".c", ".h", ".md", ".toml", ".ini", "Makefile", "run")


def tracked(*prefixes: str) -> list[str]:
    """The project's text files under ``prefixes``: committed or new, and not deleted."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", *prefixes],
                           capture_output=True, text=True, cwd=REPO, check=True)
    return sorted({f for f in files.stdout.split() if f.endswith(TEXT_SUFFIXES) and (REPO / f).is_file()})


def missing_paths(text: str, root: Path = REPO) -> list[str]:
    """The repository paths ``text`` names that match no file or folder under ``root`` (globs allowed)."""
    missing = []
    for match in PATH.finditer(text):
        path = match.group(1).rstrip(".")
        if not glob.glob(str(root / path)):
            missing.append(path)
    return missing


def prose(source: str) -> list[tuple[int, str]]:
    """The comments and docstrings of Python ``source``, with their line numbers."""
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        docstring = token.type == tokenize.STRING and token.string.lstrip("rbuf")[:3] in ('"""', "'''")
        if token.type == tokenize.COMMENT or docstring:
            found.append((token.start[0], token.string))
    return found


def class_attributes(sources: list[str]) -> dict[str, set[str]]:
    """Each class the sources define: its methods, class-level names and ``self.`` attributes."""
    classes: dict[str, set[str]] = {}
    for source in sources:
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, set()).update(_names_in(node))
    return classes


def _names_in(cls: ast.ClassDef) -> set[str]:
    names = set()
    for node in ast.walk(cls):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            names.add(node.attr)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def unknown_attributes(source: str, classes: dict[str, set[str]]) -> list[str]:
    """``Class.attribute`` names in ``source``'s prose whose class is the project's but has no such attribute."""
    unknown = []
    for line, text in prose(source):
        for match in CLASS_ATTRIBUTE.finditer(text):
            cls, attribute = match.groups()
            if cls in classes and attribute not in classes[cls]:
                unknown.append(f"{line}: {cls}.{attribute}")
    return unknown


# ------------------------------------------------------------------ the repository
def test_every_file_the_code_and_the_documents_name_exists() -> None:
    missing = {name: found for name in tracked(*NAMING_FILES) if (found := missing_paths((REPO / name).read_text()))}
    assert missing == {}


def test_every_class_attribute_a_comment_or_docstring_names_exists() -> None:
    python = [name for name in tracked("emu", "benchmarks") if name.endswith(".py")]
    sources = {name: (REPO / name).read_text() for name in python}
    classes = class_attributes(list(sources.values()))
    unknown = {name: found for name, source in sources.items() if (found := unknown_attributes(source, classes))}
    assert unknown == {}
    named = sum(len(CLASS_ATTRIBUTE.findall(text)) for source in sources.values() for _, text in prose(source))
    assert named > 50  # the check has something to check


# ------------------------------------------------------------------ negative controls
def test_a_path_that_is_not_there_is_reported(tmp_path: Path) -> None:
    (tmp_path / "emu").mkdir()
    (tmp_path / "emu" / "real.py").write_text("")
    text = "see emu/real.py and emu/gone.py, or emu/*.py; tests/test_none_*.py."
    assert missing_paths(text, tmp_path) == ["emu/gone.py", "tests/test_none_*.py"]


@pytest.mark.parametrize(("comment", "unknown"), [("# Table.lookup does it", []),
                                                  ("# Table.look_up does it", ["1: Table.look_up"]),
                                                  ("# Other.thing is not ours", [])])
def test_an_attribute_a_class_does_not_have_is_reported(comment: str, unknown: list[str]) -> None:
    classes = class_attributes(["class Table:\n    def lookup(self) -> None:\n        self.rows = 0\n"])
    assert unknown_attributes(comment + "\nx = 1\n", classes) == unknown


# ------------------------------------------------------------------ modules a reader can hold
MAX_MODULE_LINES = 500


def long_modules(names: list[str], root: Path = REPO) -> dict[str, int]:
    counts = {name: len((root / name).read_text().splitlines()) for name in names}
    return {name: n for name, n in counts.items() if n > MAX_MODULE_LINES}


def test_no_module_is_over_500_lines() -> None:
    sources = [name for name in tracked("emu") if name.endswith((".py", ".c", ".h"))]
    assert len(sources) > 100 and long_modules(sources) == {}


def test_a_long_module_is_reported(tmp_path: Path) -> None:
    (tmp_path / "short.py").write_text("x = 1\n" * MAX_MODULE_LINES)
    (tmp_path / "long.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    assert long_modules(["short.py", "long.py"], tmp_path) == {"long.py": MAX_MODULE_LINES + 1}


# ------------------------------------------------------------------ the documents the code cites
DOCS = REPO / "docs"
SPEC = re.compile(r"\bspec (?:§ ?)?(\d+(?:\.\d+)?)")
DOC_SECTION = re.compile(r"\bdocs/([\w.-]+\.md),? (?:section|§) ?(\d+[a-z]?(?:\.\d+)?)\b")
GOTCHA = re.compile(r"\bdocs/unicorn\.md,? gotcha (?:G)?(\d+)")
OUTSIDE = re.compile(r"(?:\.\./shared/|shared/notes/|\bnotes/[\w.-]+\.md|notes section)")
CITING_FILES = ("emu/", "benchmarks/", "tests/", "fixtures/", "docs/", "README.md")


def headings(document: str) -> set[str]:
    """The section numbers a document's headings give: "2.1", "8a", "1/2"."""
    return {match.group(1) for line in document.splitlines() if (match := re.match(r"#{2,4} (\d[\w/.]*?)\.? ", line))}


def unresolved_citations(text: str, docs: Path = DOCS) -> list[str]:
    """The citations in ``text`` of a section no document under ``docs`` has, and any of a file outside."""
    spec = headings((docs / "kernel-uprobes.md").read_text())
    bad = [f"spec {n}" for n in SPEC.findall(text) if n not in spec]
    for name, number in DOC_SECTION.findall(text):
        path = docs / name
        if number not in (headings(path.read_text()) if path.is_file() else set()):
            bad.append(f"docs/{name} section {number}")
    gotchas = (docs / "unicorn.md").read_text()
    bad += [f"docs/unicorn.md gotcha {n}" for n in GOTCHA.findall(text) if f"**G{n}." not in gotchas]
    bad += OUTSIDE.findall(text)
    return bad


def test_every_section_the_code_cites_is_in_docs() -> None:
    texts = {name: (REPO / name).read_text() for name in tracked(*CITING_FILES) if name != "tests/test_references.py"}
    unresolved = {name: found for name, text in texts.items() if (found := unresolved_citations(text))}
    assert unresolved == {}
    cited = sum(len(SPEC.findall(text)) + len(DOC_SECTION.findall(text)) for text in texts.values())
    assert cited > 100  # the code does cite them


@pytest.mark.parametrize(("text", "bad"), [
    ("as spec 2.1 step 8 says", []),
    ("as spec 2.7 says", ["spec 2.7"]),
    ("docs/observed.md section 8, fork", []),
    ("docs/observed.md section 8a.", ["docs/observed.md section 8a"]),
    ("docs/observed.md section 11.", ["docs/observed.md section 11"]),
    ("docs/unicorn.md gotcha 4", []),
    ("docs/unicorn.md gotcha 7", ["docs/unicorn.md gotcha 7"]),
    ("see notes/peers-and-unicorn.md", ["notes/peers-and-unicorn.md"]),
    ("see ../shared/DESIGN.md", ["../shared/"]),
])
def test_a_citation_of_a_missing_section_is_reported(tmp_path: Path, text: str, bad: list[str]) -> None:
    (tmp_path / "kernel-uprobes.md").write_text("## 2. Syscalls\n### 2.1 `sys_uprobe`\n")
    (tmp_path / "observed.md").write_text("## 8. Other behaviour\n### fork\n")
    (tmp_path / "unicorn.md").write_text("## 2. Gotchas\n4. **G4. Snapshots crash.**\n")
    assert unresolved_citations(text, tmp_path) == bad
