"""Process start-up stays lean: a plain run loads only what it uses.

benchmarks/overhead.py measures the whole-process cost against a bare Unicorn loader; these tests
pin down the part that can regress silently: modules a run of a static binary without probes,
verifiers or -v never needs must not be imported by it (each costs milliseconds of start-up)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from emu.cli import COMMAND_MODULES, command_module

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HELLO = os.path.join(REPO, "elf_samples", "hello_static")

# What the command line loads after running ``argv``, as a sorted list on stderr (its last line).
_MODULES_AFTER = (
    "import sys\n"
    "from emu.cli import main\n"
    "try:\n"
    "    status = main(sys.argv[1:])\n"
    "finally:\n"
    "    sys.stderr.write('\\n' + ' '.join(sorted(sys.modules)) + '\\n')\n"
    "raise SystemExit(status)\n"
)

NOT_FOR_A_PLAIN_RUN = (
    "emu.probes",  # probe specs and symbol resolution: only with -p
    "emu.libprobes",
    "emu.attach",  # attaching probes: only with -p (or perf_event_open)
    "emu.kernel.sigframe",  # signal frames: only when a signal is delivered
    "emu.kernel.perf",  # perf_event_open: only when called
    "emu.kernel.net",
    "emu.kernel.threads",  # clone and exit of a thread (exit_group ends a single-threaded run)
    "emu.kernel.futex",
    "emu.kernel.procsig",  # kill, timers, SIGCHLD: only when a process signals another or sets a timer
    "emu.kernel.strace",  # only with --strace
    "emu.render",  # the probe table
    "emu.designs.file",
    "emu.asm",
    "emu.check",
    "emu.bench.workloads",
    "emu.scan",
    "emu.diff",
    "emu.patchview",
    "emu.verify",
    "emu.fuzz",
    "emu.race",
    "elftools",
    "capstone",
    "keystone",
    "json",
    "logging",
    "shlex",
)


def modules_after(argv: list[str]) -> tuple[int, bytes, set[str]]:
    proc = subprocess.run([sys.executable, "-c", _MODULES_AFTER, *argv], cwd=REPO, capture_output=True, timeout=120)
    last = proc.stderr.rstrip(b"\n").rsplit(b"\n", 1)[-1]
    return proc.returncode, proc.stdout, set(last.decode().split())


def loaded(modules: set[str], name: str) -> bool:
    return any(m == name or m.startswith(name + ".") for m in modules)


def test_plain_run_of_a_static_binary_loads_none_of_the_optional_parts() -> None:
    status, out, modules = modules_after(["run", HELLO])
    assert (status, out) == (0, b"hello, world\n")
    assert "emu.machine" in modules  # the probe really ran the harness
    assert [m for m in NOT_FOR_A_PLAIN_RUN if loaded(modules, m)] == []


@pytest.mark.parametrize("module", ["emu.probes", "emu.render", "emu.attach"])
def test_a_probe_loads_what_the_plain_run_left_out(module: str) -> None:
    """Negative control: the check above sees modules that a run does load."""
    status, _out, modules = modules_after(["run", "-p", "uprobe:main", HELLO])
    assert status == 0
    assert loaded(modules, module)


def test_verbose_configures_logging() -> None:
    status, _out, modules = modules_after(["-v", "run", HELLO])
    assert status == 0 and "logging" in modules


def test_another_command_does_not_load_the_machine() -> None:
    """Each command imports its heavy parts when it runs: asking one for help loads no emulator."""
    status, out, modules = modules_after(["scan", "--help"])
    assert status == 0 and b"usage: uprobe-emu scan" in out
    assert not loaded(modules, "emu.machine") and not loaded(modules, "emu.kernel.dispatch")


@pytest.mark.parametrize("name", COMMAND_MODULES)
def test_each_command_module_defines_the_command_of_its_name(name: str) -> None:
    """The command line imports only the module a command line names, by that name."""
    module = command_module(name)
    assert name == module.NAME and module.HELP and callable(module.add_arguments) and callable(module.run)
