"""The id, session and priority system calls (emu/kernel/creds.py, procsig.py, process.py), as
kernel/sys.c answers them for a process whose real, effective and saved ids are one."""

from __future__ import annotations

import dataclasses
import errno
import struct

from conftest import GuestKernel


def _ids(g: GuestKernel, call: str) -> tuple[int, int, int]:
    cells = [g.alloc(4) for _ in range(3)]
    assert g(call, *cells) == 0
    one, two, three = (struct.unpack("<I", g.read(c, 4))[0] for c in cells)
    return one, two, three


def _as_user(g: GuestKernel, uid: int) -> GuestKernel:
    g.kernel.ident = dataclasses.replace(g.kernel.ident, uid=uid, gid=uid)
    return g


def test_asking_for_the_ids_one_has_is_allowed_to_anyone(guest: GuestKernel) -> None:
    """posix_spawn's POSIX_SPAWN_RESETIDS does setresuid(-1, getuid(), -1); make spawns every recipe so."""
    g = _as_user(guest, 1000)
    assert g("setresuid", -1 & 0xFFFFFFFF, 1000, -1 & 0xFFFFFFFF) == 0 and g("setresgid", 1000, 1000, 1000) == 0
    assert g("setuid", 1000) == 0 and g("setreuid", 1000, 1000) == 0
    assert _ids(g, "getresuid") == (1000, 1000, 1000) and _ids(g, "getresgid") == (1000, 1000, 1000)


def test_negative_control_an_unprivileged_change_is_eperm(guest: GuestKernel) -> None:
    g = _as_user(guest, 1000)
    assert g("setuid", 0) == -errno.EPERM and g("setresuid", 1001, 1001, 1001) == -errno.EPERM
    assert g("setgid", 0) == -errno.EPERM and g("getuid") == 1000


def test_root_changes_all_three_ids_together_and_not_apart(guest: GuestKernel) -> None:
    g = _as_user(guest, 0)
    assert g("setresuid", 1000, 1000, -1 & 0xFFFFFFFF) == -errno.EPERM  # saved left apart
    assert g("setreuid", -1 & 0xFFFFFFFF, 1000) == -errno.EPERM  # real left apart
    assert g("setgid", 50) == 0 and g("getgid") == 50
    assert g("setuid", 1000) == 0 and (g("getuid"), g("geteuid")) == (1000, 1000)
    assert g("setuid", 0) == -errno.EPERM  # root gave its capability away


def test_setsid_makes_a_session_except_for_a_group_leader(guest: GuestKernel) -> None:
    g = guest
    pid = g("getpid")
    assert g("setsid") == -errno.EPERM  # the first process leads its group
    assert g("setpgid", 0, pid + 7) == 0 and g("setsid") == pid
    assert (g("getsid", 0), g("getpgid", 0), g("getsid", pid)) == (pid, pid, pid)
    assert g("getsid", 99999) == -errno.ESRCH


def test_priority_is_kept_and_only_root_raises_it(guest: GuestKernel) -> None:
    g = _as_user(guest, 1000)
    assert g("getpriority", 0, 0) == 20  # 20 - nice, as the raw call returns it
    assert g("setpriority", 0, 0, 5) == 0 and g("getpriority", 0, 0) == 15
    assert g("setpriority", 0, 0, 2) == -errno.EACCES and g("setpriority", 0, 0, 40) == 0 and g("getpriority", 0, 0) == 1
    assert g("getpriority", 9, 0) == -errno.EINVAL and g("getpriority", 1, 0) == -errno.ESRCH
