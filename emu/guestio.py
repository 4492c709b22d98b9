"""Where the guest's standard streams go: the terminal's own fds, or buffers for tests."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from emu.kernel.files import S_IFIFO, Stream, synthetic_stat

# Inode numbers for the captured streams' pipes, as /proc/self/fd/N and fstat show them.
CAPTURED_PIPE_INODES = (10, 11, 12)


def _fd_writer(fd: int) -> Callable[[bytes], int]:
    def write(data: bytes) -> int:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        return len(data)

    return write


def _fd_reader(fd: int) -> Callable[[int], bytes]:
    return lambda size: os.read(fd, size)


def _host_name(fd: int, default: str) -> str:
    """What the host's /proc/self/fd/N says (``/dev/pts/0``, ``pipe:[123]``, a file), for the guest's."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return default


def _pipe(ino: int, reader: Callable[[int], bytes] | None = None,
          writer: Callable[[bytes], int] | None = None) -> Stream:
    return Stream(reader=reader, writer=writer, guest_path=f"pipe:[{ino}]",
                  _stat=synthetic_stat(S_IFIFO | 0o600, ino=ino))


@dataclass
class GuestIO:
    """Three streams. ``captured()`` collects output in memory; ``terminal()`` uses fds 0, 1, 2."""

    stdin: Stream
    stdout: Stream
    stderr: Stream
    out: bytearray = field(default_factory=bytearray)
    err: bytearray = field(default_factory=bytearray)

    @classmethod
    def terminal(cls) -> GuestIO:
        return cls(
            Stream(reader=_fd_reader(0), host=0, guest_path=_host_name(0, "/dev/stdin")),
            Stream(writer=_fd_writer(1), host=1, guest_path=_host_name(1, "/dev/stdout")),
            Stream(writer=_fd_writer(2), host=2, guest_path=_host_name(2, "/dev/stderr")),
        )

    @classmethod
    def captured(cls, stdin: bytes = b"") -> GuestIO:
        out, err = bytearray(), bytearray()
        pending = bytearray(stdin)

        def read(size: int) -> bytes:
            chunk = bytes(pending[:size])
            del pending[:size]
            return chunk

        def sink(buffer: bytearray) -> Callable[[bytes], int]:
            def write(data: bytes) -> int:
                buffer.extend(data)
                return len(data)

            return write

        ino_in, ino_out, ino_err = CAPTURED_PIPE_INODES
        return cls(_pipe(ino_in, reader=read), _pipe(ino_out, writer=sink(out)), _pipe(ino_err, writer=sink(err)),
                   out, err)
