"""pytest plugin (entry point ``pytest11``: ``uprobe_emu``): run a binary under each kernel design, assert no violations.

Fixtures
- ``kernel_design``: the design name; a test asking for it runs once per design (all of them, or the
  ones named by ``@pytest.mark.uprobe_designs("linux-6.18", ...)``, or by ``--uprobe-designs=a,b``).
- ``uprobe_machine``: a factory ``uprobe_machine(binary, *args, design=..., probes=[...], verify=...)``
  returning a :class:`UprobeRun` (attached, verifiers installed, not yet run); ``.run()`` gives a
  :class:`UprobeReport` (exit status, stdout, stderr, hits, violations).
- ``uprobe_check``: ``uprobe_check(binary, *args, design=..., probes=[...])`` -> ``emu.check.DesignReport``
  (an unprobed reference run, then the probed run with verifiers, compared like ``uprobe-emu check``).

Helper: :func:`assert_no_violations(report)` fails with one readable line per violation.

The emulator is imported lazily, so loading this plugin costs nothing for unrelated test suites.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from emu.check import DesignReport
    from emu.guestio import GuestIO
    from emu.machine import Attachment, Machine, RunResult
    from emu.verify.session import VerifySession
    from emu.violations import Violation

MARKER = "uprobe_designs"
DEFAULT_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C", "HOME": "/nonexistent", "TZ": "UTC"}
DEFAULT_TIMEOUT_S = 120.0
MAX_LISTED = 30


# ----------------------------------------------------------------------------- reports
@dataclass
class UprobeReport:
    """One finished run under one design."""

    design: str
    binary: str
    result: RunResult
    stdout: bytes
    stderr: bytes
    violations: list[Violation]
    hits: dict[str, int] = field(default_factory=dict)  # probe spec -> hits

    @property
    def exit_status(self) -> int:
        return self.result.exit_status

    @property
    def text(self) -> str:
        return self.stdout.decode(errors="replace")


@dataclass
class UprobeRun:
    """A machine with probes attached and verifiers installed; call :meth:`run` once."""

    design: str
    binary: str
    machine: Machine
    io: GuestIO
    session: VerifySession
    attachments: list[Attachment] = field(default_factory=list)

    def run(self) -> UprobeReport:
        result = self.machine.run()
        self.session.finish(result.message or result.ending.value, killed=result.signal is not None)
        hits = {str(p["spec"]): int(p["hits"]) for p in result.probes}
        return UprobeReport(self.design, self.binary, result, bytes(self.io.out), bytes(self.io.err),
                            list(self.session.violations), hits)


def _attach(machine: Machine, spec: str) -> Attachment:
    from emu.machine import Attachment

    att = machine.attach(spec)
    if not isinstance(att, Attachment):
        raise TypeError(f"{spec}: library probes are not supported by uprobe_machine")
    return att


def _violations_of(report: Any) -> tuple[str, list[Violation], str | None]:
    """(design, violations, divergence) from an UprobeReport, a DesignReport, a VerifySession or a list."""
    design = getattr(report, "design", None)
    if design is None and hasattr(report, "machine"):
        design = report.machine.design.name
    design = str(design or "")
    divergence = getattr(report, "divergence", None)
    if hasattr(report, "violations"):
        return design, list(report.violations), divergence
    return design, list(report), None


def assert_no_violations(report: Any, *, same_output: bool = False) -> None:
    """Fail with every violation listed (kind, probe, address, hit, summary and evidence).

    ``report``: an :class:`UprobeReport`, an ``emu.check.DesignReport``, a ``VerifySession`` or a list of
    ``Violation``. With ``same_output=True`` a DesignReport whose output diverged from the unprobed run fails too.
    """
    design, violations, divergence = _violations_of(report)
    diverged = same_output and bool(divergence)
    if not violations and not diverged:
        return
    __tracebackhide__ = True
    where = f" under {design}" if design else ""
    kinds = sorted({v.kind.value for v in violations})
    lines = [f"{len(violations)} uprobe violation(s){where}" + (f" ({', '.join(kinds)})" if kinds else "") + ":"]
    lines += [f"  {v.line()}" for v in violations[:MAX_LISTED]]
    if len(violations) > MAX_LISTED:
        lines.append(f"  ... {len(violations) - MAX_LISTED} more")
    if violations:
        lines.append("evidence of the first:")
        lines += ["  " + line for line in violations[0].details_text().splitlines()]
    if diverged:
        lines.append(f"output differs from the unprobed run{where}: {divergence}")
    pytest.fail("\n".join(lines), pytrace=False)


# ----------------------------------------------------------------------------- hooks
def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("uprobe-emu")
    group.addoption("--uprobe-designs", metavar="D1,D2", default=None,
                    help="kernel designs the kernel_design fixture runs over (default: all, or the test's marker)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARKER}(*names): run a test using the kernel_design fixture only under these uprobe-emu designs")


def _all_designs() -> list[str]:
    from emu.designs import DESIGNS

    return list(DESIGNS)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "kernel_design" not in metafunc.fixturenames:
        return
    known = _all_designs()
    marker = metafunc.definition.get_closest_marker(MARKER)
    designs = [str(n) for n in marker.args] if marker is not None and marker.args else known
    option = metafunc.config.getoption("--uprobe-designs", default=None)
    if option:
        wanted = [n.strip() for n in str(option).split(",") if n.strip()]
        designs = [d for d in designs if d in wanted]
    unknown = [d for d in designs if d not in known]
    if unknown:
        raise pytest.UsageError(f"{metafunc.definition.nodeid}: unknown uprobe design(s) {', '.join(unknown)} "
                                f"(known: {', '.join(known)})")
    metafunc.parametrize("kernel_design", designs, ids=designs)


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture
def kernel_design(request: pytest.FixtureRequest) -> str:
    """The design under test (parametrized by pytest_generate_tests; this body is the fallback)."""
    from emu.designs import DEFAULT_DESIGN

    return str(getattr(request, "param", DEFAULT_DESIGN))


MachineFactory = Callable[..., UprobeRun]


@pytest.fixture
def uprobe_machine(request: pytest.FixtureRequest) -> MachineFactory:
    """Factory: ``uprobe_machine(binary, *args, design=None, probes=(), verify=DEFAULT, env=None, stdin=b"",
    timeout_s=120, **run_options)``. ``design`` defaults to the test's ``kernel_design`` when it has one."""

    def make(binary: str | os.PathLike[str], *args: str, design: str | None = None, probes: Iterable[str] = (),
             verify: Sequence[Any] | None = None, env: dict[str, str] | None = None, stdin: bytes = b"",
             **options: Any) -> UprobeRun:
        from emu.designs import DEFAULT_DESIGN
        from emu.guestio import GuestIO
        from emu.machine import Machine, RunOptions
        from emu.verify.session import DEFAULT_VERIFIERS, VerifySession

        chosen = design or _fixture_design(request) or DEFAULT_DESIGN
        path = os.fspath(binary)
        options.setdefault("timeout_s", DEFAULT_TIMEOUT_S)
        io = GuestIO.captured(stdin)
        machine = Machine(path, [path, *args], dict(DEFAULT_ENV if env is None else env),
                          RunOptions(design=chosen, **options), io)
        attachments = [_attach(machine, spec) for spec in probes]
        session = VerifySession(machine, DEFAULT_VERIFIERS if verify is None else verify)
        return UprobeRun(chosen, path, machine, io, session, attachments)

    return make


@pytest.fixture
def uprobe_check(request: pytest.FixtureRequest) -> Callable[..., DesignReport]:
    """``uprobe_check(binary, *args, design=None, probes=(), env=None, stdin=b"")`` -> DesignReport, via
    emu.check.run_check: an unprobed reference run, then the probed run under one design with verifiers."""

    def check(binary: str | os.PathLike[str], *args: str, design: str | None = None, probes: Iterable[str] = (),
              env: dict[str, str] | None = None, stdin: bytes = b"", **options: Any) -> DesignReport:
        from emu.check import CheckRequest, run_check
        from emu.designs import DEFAULT_DESIGN
        from emu.machine import RunOptions

        chosen = design or _fixture_design(request) or DEFAULT_DESIGN
        path = os.fspath(binary)
        options.setdefault("timeout_s", DEFAULT_TIMEOUT_S)
        req = CheckRequest(binary=path, argv=[path, *args], env=dict(DEFAULT_ENV if env is None else env),
                           specs=tuple(probes), designs=(chosen,), options=RunOptions(**options), stdin=stdin,
                           raise_errors=True)
        return run_check(req)[0]

    return check


def _fixture_design(request: pytest.FixtureRequest) -> str | None:
    if "kernel_design" in request.fixturenames:
        return str(request.getfixturevalue("kernel_design"))
    return None
