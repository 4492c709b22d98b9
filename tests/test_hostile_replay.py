"""`replay` of a finding someone sent you: whatever the file holds, one line and exit 2, or a replay;
never a traceback, and never the Python of a design file the finding names but the user did not."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emu.cli import main
from emu.errors import EXIT_HARNESS_ERROR
from emu.fuzz import check_case, generate
from emu.fuzz.findings import write_finding

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "designs"


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A real finding's record (linux-6.18 clobbers the red zone: some early case is one)."""
    case = next(c for c in (generate(0, i) for i in range(60)) if check_case(c, "linux-6.18").finding)
    finding = write_finding(str(tmp_path_factory.mktemp("finding")), case, case, check_case(case, "linux-6.18"))
    return dict(json.loads(Path(finding.json_path).read_text()))


def replay(capfd: pytest.CaptureFixture[str], path: Path, *extra: str) -> tuple[int, str, str]:
    status = main(["replay", *extra, str(path)])
    out, err = capfd.readouterr()
    return status, out, err


def assert_one_line_error(status: int, out: str, err: str) -> None:
    assert status == EXIT_HARNESS_ERROR and out == "", (status, out, err)
    assert err.count("\n") == 1 and err.startswith("uprobe-emu: ") and "Traceback" not in err, err


HOSTILE_TEXTS: dict[str, Callable[[str], str]] = {
    "seed 1e999": lambda text: text.replace('"seed": 0', '"seed": 1e999'),
    "arrays 200,000 deep": lambda _text: "[" * 200_000 + "]" * 200_000,
    "a record of a string": lambda _text: '"case"',
    "not UTF-8": lambda _text: "\udcff",
}


@pytest.mark.parametrize("name", list(HOSTILE_TEXTS))
def test_hostile_texts_are_one_line_errors(name: str, record: dict[str, Any], tmp_path: Path,
                                           capfd: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "finding.json"
    path.write_bytes(HOSTILE_TEXTS[name](json.dumps(record)).encode("utf-8", "surrogateescape"))
    assert_one_line_error(*replay(capfd, path))


HOSTILE_VALUES = st.one_of(
    st.integers(min_value=-(2**300), max_value=2**300).map(lambda n: hex(n) if n % 2 else n),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=50), st.booleans(), st.none(),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
    st.sampled_from(["__class__", "__dict__", "rip", "sp", "0x" + "f" * 40, "-1", "1e999", "nan"]),
)
FIELDS = [("case", "seed"), ("case", "index"), ("case", "site"), ("case", "entry"), ("case", "flags"),
          ("case", "regs", 0), ("case", "regs"), ("case", "stores"), ("case", "stores", 0, "value"),
          ("case", "stores", 0, "offset"), ("case", "stores", 0, "kind"), ("case", "action"),
          ("case", "action", "reg"), ("case", "action", "value"), ("case", "action", "kind"), ("design",),
          ("design_file",), ("case", "uretprobe"), ("aslr",)]


def _set(record: dict[str, Any], where: tuple[Any, ...], value: object) -> dict[str, Any]:
    out = copy.deepcopy(record)
    if where[:2] == ("case", "action") and not isinstance(out["case"].get("action"), dict):
        out["case"]["action"] = {"kind": "set-reg", "reg": "ax", "value": "0x1"}
    if where[:3] == ("case", "stores", 0) and not out["case"]["stores"]:
        out["case"]["stores"] = [{"offset": 8, "size": 8, "kind": "mov", "value": "0x1", "cc": ""}]
    node: Any = out
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(where=st.sampled_from(FIELDS), value=HOSTILE_VALUES)
def test_hostile_fields_are_one_line_errors_or_a_replay(where: tuple[Any, ...], value: object,
                                                        record: dict[str, Any], tmp_path: Path,
                                                        capfd: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "finding.json"
    path.write_text(json.dumps(_set(record, where, value)))
    status, out, err = replay(capfd, path)
    if status == EXIT_HARNESS_ERROR:
        assert_one_line_error(status, out, err)
    else:
        assert status in (0, 1) and err == "", (status, err)


def test_a_design_file_the_finding_names_is_not_run_unless_the_user_names_it(
        record: dict[str, Any], tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """The negative control is the marker: the file's code runs only when the user asks for it."""
    marker = tmp_path / "ran"
    design = tmp_path / "their_design.py"
    design.write_text(f"open({str(marker)!r}, 'w').close()\n"
                      + (EXAMPLES / "slot_sysret.py").read_text())
    path = tmp_path / "finding.json"
    path.write_text(json.dumps({**record, "design": "slot-sysret", "design_file": str(design)}))
    status, out, err = replay(capfd, path)
    assert_one_line_error(status, out, err)
    assert "--design-file" in err and not marker.exists()
    status, out, err = replay(capfd, path, "--design-file", str(design))
    assert status in (0, 1) and marker.exists(), err
