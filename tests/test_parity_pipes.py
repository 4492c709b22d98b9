"""Pipes, processes, sockets and signals against the real kernel: each command line runs natively and
under `uprobe-emu run` in the same test, and what a caller sees must be identical: stdout, stderr,
and the exit status or the terminating signal (a guest killed by signal N kills the tool with N).

Both sides get the same clean environment (a fresh HOME, PATH, LC_ALL, TZ) and working directory."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from emu.cli import main

PY = "/usr/bin/python3.11"
PATH = "/usr/bin:/bin"
NATIVE_TIMEOUT_S = 60

BASH = [
    "yes | head -1",
    "seq 1 100000 | head -1; echo ${PIPESTATUS[@]}",
    "yes | head -c 200000 | wc -c; echo ${PIPESTATUS[@]}",
    "yes | (head -c 10; exit 4); echo ${PIPESTATUS[@]}",
    "seq 1 20000 | sort -rn | head -3",
    "seq 1 5000 | tr 0-9 a-j | tail -2 | cat -n",
    "printf 'b\\na\\nc\\n' | sort | uniq -c | sort -rn",
    "seq 1 100000 | grep -c 7",
    "echo out; echo err >&2; exit 3",
    "{ echo to-err >&2; echo to-out; } 2>&1 | tr a-z A-Z",
    "exec 3>&1; echo via3 >&3; ls /nonexistent 2>&1 >/dev/null | wc -l",
    "cat <<EOF | wc -w\none two three\nEOF",
    "echo $(echo inner $(echo deeper))",
    "x=$(seq 3 | paste -sd+); echo $((x))",
    "(echo child) & for i in $(seq 1 3000); do :; done; echo parent; wait",  # a busy parent lets the child run
    "(sleep 0.2; echo late) & echo early; wait; echo done",
    "sleep 5 & kill $!; wait $!; echo $?",
    "bash -c 'kill -TERM $$'; echo $?",
    "exec 2>/dev/null; bash -c 'kill -9 $$'; echo $?",  # (bash's report of it names the real pid)
    "kill -SEGV $$",
    "trap 'echo caught' USR1; kill -USR1 $$; echo after",
    "timeout 0.2 bash -c 'while :; do :; done'; echo $?",  # two computing processes share the CPU
]

COMMANDS: list[list[str]] = [["bash", "-c", line] for line in BASH] + [
    ["timeout", "--preserve-status", "5", "bash", "-c", "kill -TERM $$"],
    ["timeout", "1", "sleep", "5"],
    [PY, "-c", "import subprocess; print(subprocess.run(['cat'], input=b'x', stdout=subprocess.PIPE).stdout)"],
    [PY, "-c", "import subprocess; print(subprocess.run(['sh', '-c', 'echo o; echo e >&2; exit 7'], "
               "capture_output=True))"],
    [PY, "-c", "import subprocess; p = subprocess.Popen(['sleep', '10']); p.kill(); print(p.wait())"],
    [PY, "-c", "import subprocess; print(subprocess.check_output('seq 1 30000 | tail -1', shell=True))"],
    [PY, "-c", "import socket\na, b = socket.socketpair()\na.sendall(b'ping' * 1000)\na.shutdown(socket.SHUT_WR)\n"
               "d = b''\nwhile (c := b.recv(999)):\n    d += c\nprint(len(d), b.getpeername(), b.recv(1))"],
    [PY, "-c", "import socket, os\na, b = socket.socketpair()\nif os.fork() == 0:\n"
               "    a.close(); b.sendall(b'from child'); os._exit(0)\nb.close(); print(a.recv(100)); print(os.wait()[1])"],
    [PY, "-c", "import socket, os\nr, w = os.pipe()\na, b = socket.socketpair()\nsocket.send_fds(a, [b'x'], [w])\n"
               "os.close(w)\nm, fds, *_ = socket.recv_fds(b, 1, 1)\nos.write(fds[0], b'passed'); os.close(fds[0])\n"
               "print(m, os.read(r, 10), os.read(r, 10))"],
    [PY, "-c", "import threading, queue\nq = queue.Queue()\nts = [threading.Thread(target=q.put, args=(i,)) for i in range(5)]\n"
               "[t.start() for t in ts]; [t.join() for t in ts]\nprint(sorted(q.get() for _ in range(5)))"],
    [PY, "-c", "import os, signal\npid = os.fork()\nif pid == 0:\n    signal.pause()\n"
               "os.kill(pid, signal.SIGTERM); print(os.waitpid(pid, 0)[1])"],
    [PY, "-c", "import os\nos.kill(os.getpid(), 9)"],
    [PY, "-c", "import multiprocessing as mp\ndef f(c):\n    c.send([42, 'hi']); c.close()\nctx = mp.get_context('fork')\n"
               "a, b = ctx.Pipe()\np = ctx.Process(target=f, args=(b,))\np.start()\n"
               "print(a.recv()); p.join(); print(p.exitcode)"],
    [PY, "-c", "import os, fcntl\nr, w = os.pipe()\n"
               "print(fcntl.fcntl(w, 1032), fcntl.fcntl(w, 1031, 10000), fcntl.fcntl(r, 1032))"],
    [PY, "-c", "import os, select\nr, w = os.pipe()\np = select.poll(); p.register(r, select.POLLIN)\nprint(p.poll(0))\n"
               "os.write(w, b'x'); print(p.poll(0)); os.close(w); os.read(r, 1); print(p.poll(0))"],
    [PY, "-c", "import selectors, socket\ns = selectors.DefaultSelector(); a, b = socket.socketpair()\n"
               "s.register(b, selectors.EVENT_READ)\na.send(b'k'); print([(k.fd == b.fileno(), e) for k, e in s.select(1)])"],
    [PY, "-c", "import os\nr, w = os.pipe()\nos.set_blocking(w, False)\nn = 0\ntry:\n"
               "    while True: n += os.write(w, b'x' * 4096)\nexcept BlockingIOError:\n    print('full at', n)"],
]

SLOW = [  # a few seconds each under emulation: the interpreter starts, then an event loop or a pool
    [PY, "-c", "import asyncio\nasync def m():\n    await asyncio.sleep(0.01)\n"
               "    p = await asyncio.create_subprocess_exec('echo', 'hi', stdout=-1)\n    return await p.communicate()\n"
               "print(asyncio.run(m()))"],
    [PY, "-c", "import asyncio\nasync def w(i):\n    await asyncio.sleep(0.01 * (3 - i))\n    return i\nasync def m():\n"
               "    return [await t for t in asyncio.as_completed([w(i) for i in range(3)])]\nprint(asyncio.run(m()))"],
    [PY, "-c", "import concurrent.futures as f\nwith f.ThreadPoolExecutor(4) as e:\n"
               "    print(sorted(e.map(lambda x: x * x, range(8))))"],
    # the pools' queues lock with SemLocks: sem_t in MAP_SHARED /dev/shm pages, futexes across processes
    [PY, "-c", "import concurrent.futures as f\ndef sq(x): return x * x\nif __name__ == '__main__':\n"
               "    with f.ProcessPoolExecutor(2) as e: print(sorted(e.map(sq, range(8))))"],
    [PY, "-c", "import multiprocessing as mp\ndef sq(x): return x * x\nif __name__ == '__main__':\n"
               "    with mp.Pool(2) as p: print(p.map(sq, range(8)))"],
]


def _env(home: Path) -> dict[str, str]:
    return {"PATH": PATH, "LC_ALL": "C", "HOME": str(home), "TZ": "UTC"}


def _native(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[bytes, bytes, int]:
    prog = shutil.which(argv[0], path=PATH)
    assert prog is not None
    proc = subprocess.run([prog, *argv[1:]], env=env, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True,
                          timeout=NATIVE_TIMEOUT_S)
    return proc.stdout, proc.stderr, proc.returncode


def _emulated(argv: list[str], env: dict[str, str], cwd: Path, capfd: pytest.CaptureFixture[bytes]
              ) -> tuple[bytes, bytes, int]:
    """`uprobe-emu run` in this process: main() says -N where the program would die of signal N."""
    prog = shutil.which(argv[0], path=PATH)
    assert prog is not None
    options = [arg for key, value in env.items() for arg in ("--env", f"{key}={value}")]
    capfd.readouterr()
    old = os.getcwd()
    os.chdir(cwd)
    try:
        status = main(["run", "--clear-env", *options, "--timeout", "120", prog, *argv[1:]])
    finally:
        os.chdir(old)
    out, err = capfd.readouterr()
    return out, err, status


def _compare(argv: list[str], tmp_path: Path, capfdbinary: pytest.CaptureFixture[bytes]) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = _env(home)
    native = _native(argv, env, tmp_path)
    emulated = _emulated(argv, env, tmp_path, capfdbinary)
    assert emulated == native, argv


def _name(argv: list[str]) -> str:
    return " ".join(argv)[:70]


@pytest.mark.parametrize("argv", COMMANDS, ids=_name)
def test_same_as_native(argv: list[str], tmp_path: Path, capfdbinary: pytest.CaptureFixture[bytes]) -> None:
    _compare(argv, tmp_path, capfdbinary)


@pytest.mark.slow
@pytest.mark.parametrize("argv", SLOW, ids=_name)
def test_same_as_native_event_loops_and_pools(argv: list[str], tmp_path: Path,
                                              capfdbinary: pytest.CaptureFixture[bytes]) -> None:
    _compare(argv, tmp_path, capfdbinary)


def test_the_comparison_sees_a_difference(tmp_path: Path, capfdbinary: pytest.CaptureFixture[bytes]) -> None:
    """Negative control: a program whose output depends on the pid differs, and the check says so."""
    argv = [PY, "-c", "import os; print(os.getpid())"]
    home = tmp_path / "home"
    home.mkdir()
    env = _env(home)
    assert _emulated(argv, env, tmp_path, capfdbinary) != _native(argv, env, tmp_path)
