"""The command that replays one site of one corpus entry under one design: `uprobe-emu check` of
the entry's command line, its environment and stdin, with that site alone probed. It shows what the
survey saw there (the red-zone verifier's changed bytes, the output against the unprobed run's)
without the survey's database or its other sites."""

from __future__ import annotations

import shlex

from emu.survey.corpus import Entry


def replay_command(entry: Entry, design: str, spec: str) -> str:
    env = [f"--env={k}={v}" for k, v in entry.env]
    argv = ["uprobe-emu", "check", f"--kernel={design}", "--clear-env", *env, f"--timeout={entry.timeout_s:g}",
            "-p", spec, entry.binary, *entry.args]
    if entry.stdin_file is not None:
        argv[2:2] = ["--stdin", entry.stdin_file]
    elif entry.stdin:
        argv[2:2] = ["--stdin", "-"]
        text = entry.stdin.decode("utf-8", "surrogateescape")
        return f"printf %s {shlex.quote(text)} | {shlex.join(argv)}"
    return shlex.join(argv)
