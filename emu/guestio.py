"""Where the guest's standard streams go: the terminal's own fds, or buffers for tests."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from emu.kernel.vfs import Stream


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
            Stream(reader=_fd_reader(0), host=0, guest_path="/dev/stdin"),
            Stream(writer=_fd_writer(1), host=1, guest_path="/dev/stdout"),
            Stream(writer=_fd_writer(2), host=2, guest_path="/dev/stderr"),
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

        return cls(Stream(reader=read), Stream(writer=sink(out)), Stream(writer=sink(err)), out, err)
