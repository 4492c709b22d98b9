"""The design API (emu/designs/__init__.py): built-in designs assemble to the kernel's bytes, bad designs are
refused before anything runs, design files load, and the examples behave as their docstrings say."""

from __future__ import annotations

import ast
import json
import time
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emu import cli
from emu.check import CheckRequest, run_check
from emu.designs import (
    DESIGNS,
    Design,
    DesignError,
    Exit,
    Handler,
    Layout,
    Patch,
    ProbeFrom,
    ReturnTrampoline,
    SiteForm,
    Trampoline,
    forget_user_designs,
    get_design,
    known_designs,
)
from emu.designs.file import load_design_file
from emu.patchview import record_patches

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "designs"
TARGETS = str(ROOT / "elf_samples" / "probe_targets")
REDZONE = str(ROOT / "elf_samples" / "redzone_probe")
SIX18 = DESIGNS["linux-6.18"]
SLOT_17_BYTES = "lea -128(%rsp),%rsp; push %rcx; push %r11; push %rax; push %rdx; mov $336,%eax; syscall"


@pytest.mark.parametrize(("design", "trampoline", "uretprobe"), [
    ("linux-6.18", "5141535048c7c0500100000f0558415b59c3cc", "5051415348c7c04f0100000f05415b59c3cc"),  # spec 1.3, 1.4
    ("nop10", "5141535048c7c0500100000f0558415b59c28000cc", "5051415348c7c04f0100000f05415b59c3cc"),  # spec 1.5
    ("jmp-slots", "488d64248051415350b8500100000f05", "5051415348c7c04f0100000f05415b59c3cc"),  # DESIGN.md
    ("uretprobe-rfc", None, "5051415348c7c0ce0100000f05cc"),
    ("int3", None, "cc"),
])
def test_builtin_designs_assemble_to_the_kernels_bytes(design: str, trampoline: str | None, uretprobe: str) -> None:
    d = DESIGNS[design]
    assert d.problems() == []
    assert (d.trampoline.code_bytes.hex() if d.trampoline else None) == trampoline
    assert d.uretprobe.code_bytes.hex() == uretprobe
    if d.patch is not None and d.patch.prefix:
        assert d.patch.prefix_bytes.hex() == "488d642480"  # lea -0x80(%rsp),%rsp (spec 1.5)


@pytest.mark.parametrize(("design", "message"), [
    (replace(SIX18, patch=Patch("nop5", prefix="lea -128(%rsp),%rsp")),
     "patch is 10 bytes (5-byte prefix + 5-byte call rel32), longer than its 5-byte nop5 site"),
    (replace(SIX18, trampoline=Trampoline(bytes(4090) + SIX18.trampoline.code_bytes)),  # type: ignore[union-attr]
     "trampoline code is 4109 bytes, does not fit a 4096-byte page"),
    (replace(SIX18, handler=None), "has patch and trampoline but no handler"),
    (replace(SIX18, trampoline=Trampoline("push %rcx; pop %rcx; ret")), "trampoline has 0 syscall instructions"),
    (replace(SIX18, trampoline=Trampoline("movq $335,%rax; syscall; ret")),
     "trampoline does not load syscall number 336 into rax"),
    (replace(SIX18, handler=Handler(saved=("ax", "rip"))), "handler.saved names 'rip', not a saved register"),
    (replace(SIX18, handler=Handler(probe_from="slot")), "a 'slots' trampoline and handler.probe_from='slot' go together"),
    (replace(SIX18, patch=Patch(branch="jmp")), "needs patch.branch='call'"),
    (replace(SIX18, handler=Handler(exit="sideways")), "handler.exit 'sideways' is not one of"),
    (replace(SIX18, trampoline=Trampoline(SLOT_17_BYTES, layout="slots", slot_size=16),
             handler=Handler(probe_from="slot", exit="iret")),
     "trampoline code is 17 bytes, does not fit its 16-byte slot"),
    (replace(SIX18, uretprobe=ReturnTrampoline("push %rax; movq $335,%rax; syscall; ret", nr=335, saved=("cx", "ax", "r11"))),
     "which must be 'ax'"),
    (replace(SIX18, uretprobe=ReturnTrampoline("nop; int3")), "must start with int3"),
    (replace(SIX18, trampoline=Trampoline("push %rcx; bogus %rax")), "cannot assemble"),
    (replace(SIX18, name="has space"), "design name 'has space' must be"),
])
def test_inconsistent_designs_are_refused_with_the_reason(design: Design, message: str) -> None:
    with pytest.raises(DesignError, match=None) as info:
        design.validate()
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_design_object_is_validated_when_a_machine_is_built() -> None:
    broken = replace(SIX18, name="broken", handler=None)
    with pytest.raises(DesignError, match="no handler"):
        get_design(broken)
    assert get_design(SIX18) is SIX18


def test_user_design_names_cannot_shadow_builtins(tmp_path: Path) -> None:
    path = tmp_path / "d.py"
    path.write_text("from emu.designs import Design\nd = Design('jmp-slots')\n")
    with pytest.raises(DesignError, match="'jmp-slots' is built in"):
        load_design_file(str(path))


_PARTS = "from emu.designs import Design, Patch, Trampoline, Handler\n"
_TRAMP = "push %rcx; push %r11; push %rax; movq $336,%rax; syscall; pop %rax; pop %r11; pop %rcx; ret"


@pytest.mark.parametrize(("text", "message"), [
    ("from emu.designs import Design\nx = (\n", ":2: syntax error"),
    ("import os\n\nraise ValueError('no')\n", ":3: ValueError: no"),
    ("x = 1\n", "defines no Design"),
    ("from emu.designs import Design\na = Design('twin')\nb = Design('twin', source='other')\n", "two designs are named 'twin'"),
    # types and sizes are checked before anything is assembled (a 50 MB trampoline is refused unread)
    (f"{_PARTS}d = Design('t', patch=Patch(), trampoline=Trampoline({_TRAMP!r}), handler=Handler(sp_skip='8'))\n",
     "handler.sp_skip must be an int, not str '8'"),
    (f"{_PARTS}d = Design('t', patch=Patch(), trampoline=Trampoline({_TRAMP!r}), handler=Handler(saved='ax'))\n",
     "handler.saved must be a tuple of register names"),
    (f"{_PARTS}d = Design('t', patch=Patch(), trampoline=Trampoline(123), handler=Handler())\n",
     "trampoline.code must be assembly text (str) or bytes, not int 123"),
    (f"{_PARTS}d = Design('t', patch=Handler(), trampoline=Trampoline({_TRAMP!r}), handler=Handler())\n",
     "patch must be a Patch or None, not Handler"),
    (f"{_PARTS}d = Design('t', patch=Patch(), trampoline=Trampoline('nop;' * (13 << 20)), handler=Handler())\n",
     "trampoline.code is 54525952 characters of assembly, more than 65536"),
    (f"{_PARTS}d = Design('t', patch=Patch(), trampoline=Trampoline(bytes(50 << 20)), handler=Handler())\n",
     "trampoline.code is 52428800 bytes, more than 65536 (it must fit 4096 bytes)"),
    (f"{_PARTS}d = Design(['t'])\n", "design name must be a str, not list"),
    ("import sys\nsys.exit(0)\n", "design.py:2: the design file called sys.exit(0)"),
    # the file runs in a child process: what it does to that process is reported, not obeyed
    ("import os\nos._exit(0)\n", "ended the process it ran in (it called os._exit(0))"),
    ("raise BaseException('boom')\n", "design.py:1: BaseException: boom"),
    ("raise KeyboardInterrupt\n", "design.py:1: KeyboardInterrupt"),
    ("hog = bytearray(1 << 40)\n", "design.py:1: MemoryError"),
    ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n", "killed by SIGKILL"),
    # only Design and its parts come back from the child: a subclass of the file's own is not one
    (f"{_PARTS}class Mine(Design):\n    pass\nd = Mine('t', patch=Patch(), trampoline=Trampoline({_TRAMP!r}), "
     "handler=Handler())\n", "the designs are not plain Design objects"),
])
def test_design_file_errors_are_one_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "design.py"
    path.write_text(text)
    with pytest.raises(DesignError) as info:
        load_design_file(str(path))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_design_file_that_never_ends_is_stopped_at_the_timeout(tmp_path: Path) -> None:
    path = tmp_path / "loop.py"
    path.write_text("while True:\n    pass\n")
    start = time.monotonic()
    with pytest.raises(DesignError, match="ran past 1 s"):
        load_design_file(str(path), timeout_s=1)
    assert time.monotonic() - start < 5


def test_a_well_typed_design_file_loads(tmp_path: Path) -> None:
    """The negative control of the type checks: the same file with the right types is accepted."""
    path = tmp_path / "good.py"
    path.write_text(f"{_PARTS}d = Design('well-typed', patch=Patch(), trampoline=Trampoline({_TRAMP!r}), "
                    "handler=Handler(sp_skip=8, saved=('ax', 'r11', 'cx')))\n")
    assert [d.name for d in load_design_file(str(path))] == ["well-typed"]


def test_wrong_types_in_the_python_api_are_a_design_error_not_a_type_error() -> None:
    with pytest.raises(DesignError, match="handler.outside_errno must be an int"):
        Design("api", patch=Patch(), trampoline=Trampoline(_TRAMP), handler=Handler(outside_errno="ENXIO")).validate()  # type: ignore[arg-type]


def test_cli_refuses_a_bad_design_file_before_running(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.py"
    path.write_text("from emu.designs import Design, Patch, Trampoline, Handler\n"
                    "d = Design('too-long', patch=Patch(prefix='lea -128(%rsp),%rsp'),\n"
                    "           trampoline=Trampoline('movq $336,%rax; syscall; ret'), handler=Handler())\n")
    for command in ("run", "check", "bench", "patch"):
        extra = ["-p", "uprobe:t_nop5"] if command == "patch" else []
        argv = [command, "--design-file", str(path), *extra] + ([] if command == "bench" else [TARGETS])
        assert cli.main(argv) == 2, command
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "design 'too-long': patch is 10 bytes" in err[0], (command, err)
    assert cli.main(["run", "--design-file", str(tmp_path / "missing.py"), TARGETS]) == 2
    assert "no such file" in capsys.readouterr().err


def test_example_jmp_slots_is_identical_to_the_builtin_design() -> None:
    (mine,) = load_design_file(str(EXAMPLES / "jmp_slots.py"))
    builtin = DESIGNS["jmp-slots"]
    assert mine.trampoline.code_bytes == builtin.trampoline.code_bytes  # type: ignore[union-attr]
    assert mine.uretprobe.code_bytes == builtin.uretprobe.code_bytes
    for path, specs in ((REDZONE, ("uprobe:rz_nop5_site", "usdt:redzone:site")),
                        (TARGETS, ("uprobe:t_nop5", "uretprobe:t_push", "uprobe:t_ret", "uprobe:t_jne"))):
        a, b = run_check(CheckRequest(path, [path, "3"], {}, specs=specs, designs=("jmp-slots", mine.name)))
        assert (a.hits, a.exits, a.same_output, a.violations) == (b.hits, b.exits, b.same_output, b.violations)
        assert a.result is not None and b.result is not None
        assert a.result.exit_status == b.result.exit_status and a.hits > 0
    patches = [record_patches(TARGETS, ["uprobe:t_nop5"], name, argv=[TARGETS, "2"]) for name in ("jmp-slots", mine.name)]
    assert [s.to_json() for s in patches[0].sites] == [s.to_json() for s in patches[1].sites]


def test_example_slot_pushing_first_is_caught_writing_the_red_zone() -> None:
    (flawed,) = load_design_file(str(EXAMPLES / "slot_pushes_first.py"))
    (report,) = run_check(CheckRequest(REDZONE, [REDZONE, "3"], {}, designs=(flawed.name,)))
    redzone = [v for v in report.violations if v.kind.value == "redzone"]
    assert {v.detail["offset"] for v in redzone} == {-8, -16, -24} and not report.same_output
    assert {v.detail["writer"].split(": ")[-1] for v in redzone} == {"push rcx", "push r11", "push rax"}


def test_example_slot_sysret_is_caught_losing_rcx_and_r11(tmp_path: Path) -> None:
    (flawed,) = load_design_file(str(EXAMPLES / "slot_sysret.py"))
    out = tmp_path / "check.json"
    assert cli.main(["check", "--design-file", str(EXAMPLES / "slot_sysret.py"), "--kernel", "slot-sysret,jmp-slots",
                     "--json", str(out), REDZONE, "3"]) == 0
    data = json.loads(out.read_text())["designs"]
    assert data["slot-sysret"]["violations"]["regs"] > 0 and data["jmp-slots"]["violations"]["regs"] == 0
    (report,) = run_check(CheckRequest(REDZONE, [REDZONE, "3"], {}, designs=(flawed.name,)))
    assert all(set(v.detail["registers"]) == {"rcx", "r11"} for v in report.violations)
    assert report.exits.get("sysret", 0) > 0


def test_design_file_designs_join_all_and_run_picks_the_files_first(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(EXAMPLES / "jmp_slots.py")
    assert cli.main(["run", "--design-file", path, "-p", "uprobe:t_nop5", TARGETS, "2"]) == 0
    assert "int3:1,jmp:1" in capsys.readouterr().err  # the file's design: optimized to a jmp on the first hit
    assert "my-jmp-slots" in known_designs()
    assert cli.main(["scan", TARGETS]) == 0
    assert "my-jmp-slots" in capsys.readouterr().out  # designs loaded earlier in the process are judged too


def test_the_readme_design_is_under_30_lines_and_flags_the_red_zone(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("# mydesign.py")
    code = readme[start:readme.index("```", start)]
    assert len(code.splitlines()) < 30
    path = tmp_path / "mydesign.py"
    path.write_text(code)
    (design,) = load_design_file(str(path))
    (report,) = run_check(CheckRequest(REDZONE, [REDZONE, "3"], {}, designs=(design.name,)))
    assert {v.detail["offset"] for v in report.violations if v.kind.value == "redzone"} == {-8, -16, -24}


def test_a_design_file_may_name_builtin_designs_it_builds_on(tmp_path: Path) -> None:
    path = tmp_path / "variant.py"
    path.write_text("from dataclasses import replace\nfrom emu.designs import DESIGNS\n"
                    "base = DESIGNS['nop10']\n"
                    "restore = replace(base, name='nop10-restore', patch=replace(base.patch, detach='restore'))\n")
    (design,) = load_design_file(str(path))
    assert design.name == "nop10-restore" and design.patch is not None and design.patch.detach == "restore"


@pytest.mark.parametrize(("example", "kind"), [("slot_pushes_first.py", "redzone"), ("slot_sysret.py", "regs")])
def test_the_fuzzer_flags_the_flawed_examples_and_not_the_rewritten_jmp_slots(example: str, kind: str) -> None:
    from emu.fuzz import check_case, generate

    (flawed,) = load_design_file(str(EXAMPLES / example))
    (clean,) = load_design_file(str(EXAMPLES / "jmp_slots.py"))
    cases = [generate(0, i) for i in range(40)]
    found = [v for v in (check_case(c, flawed.name) for c in cases) if v.finding]
    assert found and any(s.startswith(f"{kind}:") for v in found for s in v.violations)
    assert not any(check_case(c, clean.name).finding for c in cases)


def test_a_finding_of_a_user_design_replays_from_its_record_only_when_trusted(tmp_path: Path) -> None:
    """The record names the design's file, but that file is Python and a finding may come from anyone:
    replay runs it only when told to (--trust-design-file), else says how to name it."""
    from emu.errors import UsageError
    from emu.fuzz import check_case, generate
    from emu.fuzz.findings import replay, save_finding

    path = str(EXAMPLES / "slot_sysret.py")
    (flawed,) = load_design_file(path)
    case = next(c for c in (generate(0, i) for i in range(40)) if check_case(c, flawed.name).finding)
    finding = save_finding(str(tmp_path), case, check_case(case, flawed.name))
    assert finding.replay_command.startswith(f"uprobe-emu replay --design-file {path} ")
    assert json.loads(Path(finding.json_path).read_text())["design_file"] == path
    forget_user_designs()  # a new process: only the record says where the design lives
    with pytest.raises(UsageError, match="--design-file"):
        replay(finding.json_path)
    verdict, used = replay(finding.json_path, trust_design_file=True)
    assert used == flawed.name and verdict.finding


def test_a_design_files_choice_strings_become_members_and_a_wrong_one_is_named() -> None:
    handler = Handler(exit="iret", probe_from="slot")
    assert handler.exit is Exit.IRET and handler.probe_from is ProbeFrom.SLOT
    assert Trampoline("syscall", layout="slots").layout is Layout.SLOTS
    assert Patch(site="nop10", branch="jmp").site is SiteForm.NOP10
    assert replace(handler, exit="sysret").exit is Exit.SYSRET  # replace() runs the same conversion
    wrong = Handler(exit="sysretq")
    assert wrong.exit == "sysretq" and "handler.exit 'sysretq' is not one of trampoline, iret, sysret" in wrong.problems()


CHOICE_FIELDS = {"site", "branch", "write_order", "detach", "layout", "probe_from", "exit"}


def _string_comparisons_of_choices(tree: ast.AST) -> list[int]:
    """Lines comparing a design choice field (``x.exit``) with a string literal."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            fields = [o for o in operands if isinstance(o, ast.Attribute) and o.attr in CHOICE_FIELDS]
            strings = [o for o in operands if isinstance(o, ast.Constant) and isinstance(o.value, str)]
            if fields and strings:
                lines.append(node.lineno)
    return lines


def test_no_code_past_designs_compares_a_design_choice_with_a_string() -> None:
    found = {}
    for path in sorted((ROOT / "emu").rglob("*.py")):
        if path == ROOT / "emu" / "designs" / "__init__.py" or "report" in path.parts:  # the hit-path report's own .exit is a str
            continue
        lines = _string_comparisons_of_choices(ast.parse(path.read_text()))
        if lines:
            found[str(path.relative_to(ROOT))] = lines
    assert found == {}
    assert _string_comparisons_of_choices(ast.parse("handler.exit == 'iret'")) == [1]  # the scan sees one


def test_only_design_data_comes_back_from_a_design_file_s_process() -> None:
    """The negative control of the restricted unpickler: a pickle that would run a command is refused."""
    import io
    import os
    import pickle

    from emu.designs.file import _DesignUnpickler

    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return os.system, ("true",)

    with pytest.raises(pickle.UnpicklingError, match="not part of a design"):
        _DesignUnpickler(io.BytesIO(pickle.dumps(([Evil()], None)))).load()


HOSTILE_FRAGMENTS = [
    "raise BaseException('x')", "import os; os._exit(3)", "import sys; sys.exit('no')", "x = 1 / 0",
    "def f(): return f()\nf()", "from emu.designs import Design\nd = Design('hostile-one')", "raise SystemExit",
    "import signal, os; os.kill(os.getpid(), signal.SIGTERM)", "import os; os.close(1); os.close(2)",
    "import sys; sys.stdout = None", "del __builtins__", "global x", "import resource", "\x00", "yield 1",
    "import gc; gc.disable()", "raise KeyboardInterrupt", "exec('raise MemoryError')",
]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(HOSTILE_FRAGMENTS), st.text(max_size=20)), min_size=1, max_size=4))
def test_hostile_design_files_are_one_line_errors_or_designs(fragments: list[str]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "design.py"
        path.write_text("\n".join(fragments) + "\n", errors="surrogateescape")
        try:
            designs = load_design_file(str(path), timeout_s=5)
        except DesignError as err:
            assert str(err) and "\n" not in str(err)
        else:
            assert all(isinstance(d, Design) for d in designs)
        finally:
            forget_user_designs()
