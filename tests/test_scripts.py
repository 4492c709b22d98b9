"""execve of a "#!" script runs its interpreter, as fs/binfmt_script.c does (emu/process/scripts.py)."""

from __future__ import annotations

import errno

import pytest
from conftest import run_emulated, run_native, sample

from emu.cli import main
from emu.kernel.errno_ import SyscallError
from emu.process import scripts

EXEC_SCRIPT = sample("exec_script")


@pytest.mark.parametrize(("head", "line"), [
    (b"#!/bin/sh\necho", ("/bin/sh", None)),
    (b"#! /usr/bin/env  -S  perl -w \n", ("/usr/bin/env", "-S  perl -w")),  # one argument: the rest of the line
    (b"#!/bin/bash\t-e\n", ("/bin/bash", "-e")),
    (b"\x7fELF", None),
])
def test_the_interpreter_line(head: bytes, line: tuple[str, str | None] | None) -> None:
    assert scripts.interpreter_line(head) == line


def test_resolve_puts_the_script_after_the_interpreter_and_its_argument() -> None:
    heads = {"/s": b"#!/i -x\n", "/i": b"\x7fELF"}
    assert scripts.resolve("/s", ["s", "a"], heads.__getitem__) == ("/i", ["/i", "-x", "/s", "a"])


@pytest.mark.parametrize(("heads", "code"), [({"/s": b"#!\n"}, errno.ENOEXEC), ({"/s": b"#!/s\n"}, errno.ELOOP)])
def test_an_empty_line_or_endless_nesting_is_refused(heads: dict[str, bytes], code: int) -> None:
    with pytest.raises(SyscallError) as err:
        scripts.resolve("/s", ["s"], heads.__getitem__)
    assert err.value.errno == code


def test_a_guest_execve_of_a_script_runs_as_on_linux() -> None:
    """Debian's zcat is a shell script: an execve of it (no execvp fallback) prints zcat's version."""
    argv = [EXEC_SCRIPT, "/usr/bin/zcat", "--version"]
    native, emulated = run_native(argv, {"PATH": "/usr/bin:/bin"}), run_emulated(argv, {"PATH": "/usr/bin:/bin"})
    assert native.out.startswith(b"zcat (gzip)") and (emulated.out, emulated.status) == (native.out, native.status)


def test_negative_control_without_binfmt_script_the_execve_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(path: str, argv: list[str], head_of: object) -> tuple[str, list[str]]:
        return path, argv  # the script itself, which the ELF loader refuses (ENOEXEC)

    monkeypatch.setattr(scripts, "resolve", refuse)
    emulated = run_emulated([EXEC_SCRIPT, "/usr/bin/zcat", "--version"], {"PATH": "/usr/bin:/bin"})
    assert (emulated.out, emulated.status) == (b"execve: Exec format error\n", 1)


def test_a_script_can_be_the_program_a_run_starts_with(capfd: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--clear-env", "--env", "PATH=/usr/bin:/bin", "/usr/bin/zcat", "--version"]) == 0
    assert capfd.readouterr().out.startswith("zcat (gzip)")
