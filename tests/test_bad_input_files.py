"""Bad input files for `replay`: one line on stderr and exit 2, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from emu.cli import main


@pytest.mark.parametrize(("content", "message"), [
    (b"\xff\xfe\x00garbage", "not JSON (not UTF-8 text: byte 0xff at offset 0)"),
    (b"{not json", "not JSON"),
    (b"[1, 2]", "not a fuzz finding record"),
    (b'{"case": [1], "design": "int3"}', "not a fuzz case record"),
    (b'{"case": {"seed": "x"}, "design": "int3"}', "not a fuzz case record"),
])
def test_replay_of_a_bad_record_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes,
                                            message: str) -> None:
    path = tmp_path / "finding.json"
    path.write_bytes(content)
    assert main(["replay", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err
