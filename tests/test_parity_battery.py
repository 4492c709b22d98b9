"""Debian's own tools, each run natively and under emulation in the same test: stdout, stderr and
exit status must be identical.

Every command line runs in a fresh directory filled by SETUP, with a clean HOME and the small fixed
environment of conftest. The emulated run goes first: it cannot change the host (its writes stay in
the in-memory layer, and the test checks the tree is unchanged), so the native run then starts from
the very same files, at the same paths. The command lines write, rename and delete files, use bash
redirections, grep/sed/awk, tar/gzip, find/xargs and python3.11 (tempfile, sqlite3 on disk,
threading, file writes). benchmarks/parity_slowdown.py times the same list.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import DEFAULT_ENV, run_emulated, run_native
from test_overlay import tree_digest

BASH, PY = "/bin/bash", "/usr/bin/python3.11"
SETUP = r"""
printf 'one\ntwo\nthree\nfour\nfive\n' > data.txt
printf '10\n9\n100\n1\n' > nums.txt
printf 'a\na\nb\nb\nb\nc\n' > dup.txt
printf 'root:1\nbin:2\nsys:3\n' > colon.txt
mkdir -p sub/deep; echo needle > sub/a.txt; echo hay > sub/b.txt; echo deep > sub/deep/c.txt
printf 'sub/a.txt\nsub/b.txt\n' > list.txt
printf '\000\001\002abc' > small.bin
mkdir extracted; echo x > extracted/x; tar --mtime=@1000000000 -cf pre.tar extracted; rm -r extracted
echo zipped | gzip -n > pre.gz
"""

SHELL = [
    # coreutils
    "echo hello world", "printf '%s-%d\\n' a 1 b 2", "seq 1 20", "seq -s, 1 10", "cat data.txt",
    "head -n 3 data.txt", "tail -n 2 data.txt", "wc data.txt", "sort data.txt", "sort -rn nums.txt",
    "uniq -c dup.txt", "cut -d: -f1 colon.txt", "tr a-z A-Z < data.txt", "basename /usr/lib/x.so .so",
    "dirname /a/b/c", "expr 6 \\* 7", "false; echo $?", "ls", "ls -a sub", "mkdir -p new/dir && ls -R new",
    "cp data.txt copy.txt && cmp data.txt copy.txt && echo same", "mv data.txt moved.txt && ls && cat moved.txt",
    "rm data.txt nums.txt && ls", "ln -s data.txt l && readlink l && cat l", "touch f1 f2 && ls",
    "stat -c '%n %s %F' data.txt sub", "du -b data.txt", "md5sum data.txt", "sha256sum data.txt small.bin",
    "base64 data.txt", "od -An -tx1 small.bin", "tac data.txt", "nl data.txt", "paste data.txt nums.txt",
    "fold -w 2 nums.txt", "split -l 2 data.txt part_ && ls part_* && cat part_ab",
    "truncate -s 5 data.txt && cat data.txt", "chmod 600 data.txt && stat -c %a data.txt",
    "test -w data.txt && echo writable", "env -i A=1 /usr/bin/env", "printenv HOME; cd ~ && pwd",
    "uname -s", "date -u -d @0", "factor 123456", "numfmt --to=iec 123456789", "realpath data.txt sub/..",
    "rmdir sub; echo $?; rm -r sub && ls", "mkdir d && rmdir d && ls", "ls nope; echo $?",
    # bash redirections
    "echo a > f; echo b >> f; cat f", "exec 3> f; echo hi >&3; exec 3>&-; cat f",
    "cat < data.txt > out.txt; wc -l out.txt", "{ echo x; echo y >&2; } > f 2>&1; cat f",
    "ls nonexist 2> err.txt; echo $?; cat err.txt", "cat > f <<EOF\nline one\nline two\nEOF\ncat f",
    "set -o noclobber; echo a > data.txt; echo $?", "for i in 1 2 3; do echo $i > f$i; done; cat f1 f2 f3",
    "read x < data.txt; echo \"$x\"", "echo x > f && [ -s f ] && echo nonempty",
    # grep, sed, awk
    "grep -n o data.txt", "grep -c e data.txt", "grep -r needle sub", "grep -v o data.txt; echo $?",
    "grep -q zzz data.txt; echo $?", "sed 's/o/0/g' data.txt", "sed -i 's/one/ONE/' data.txt && cat data.txt",
    "sed -n '2,3p' data.txt", "awk '{print NR\": \"$1}' data.txt", "awk -F: '{s+=$2} END {print s}' colon.txt",
    "awk 'BEGIN{for(i=0;i<5;i++) printf \"%d \", i*i; print \"\"}'",
    "awk '{print > (\"by_\" length($0))}' data.txt && ls by_* && cat by_3",
    # tar, gzip
    "tar cf a.tar sub && tar tf a.tar", "tar xf pre.tar && cat extracted/x && ls",
    "gzip -k data.txt && gunzip -c data.txt.gz", "gzip data.txt && ls && zcat data.txt.gz", "zcat pre.gz",
    "gzip -t pre.gz && echo ok", "tar cf - sub/a.txt > t.tar && tar tf t.tar",
    # find, xargs
    "find sub -type f -name '*.txt'", "find sub -type d", "find sub -name '*.txt' -exec cat {} +",
    "xargs -a list.txt cat", "xargs -a list.txt -n 1 echo", "find . -maxdepth 1 -name '*.txt' -delete && ls",
]

PYTHON = [
    "print(sum(range(100)))",
    "import tempfile, os\nwith tempfile.NamedTemporaryFile('w+', dir='.', delete=False) as f: f.write('hi')\n"
    "print(open(f.name).read()); os.unlink(f.name); print(sorted(os.listdir('.')))",
    "import tempfile\nwith tempfile.TemporaryFile() as t: t.write(b'abc'); t.seek(0); print(t.read())",
    "import tempfile, os\nwith tempfile.TemporaryDirectory(dir='.') as d: open(os.path.join(d, 'x'), 'w').write('1');"
    " print(os.listdir(d))\nprint(len(os.listdir('.')))",
    "import sqlite3\ndb = sqlite3.connect('t.db'); db.execute('create table t(a, b)')\n"
    "db.executemany('insert into t values (?, ?)', [(i, str(i)) for i in range(200)]); db.commit(); db.close()\n"
    "db = sqlite3.connect('t.db'); print(db.execute('select count(*), sum(a), max(b) from t').fetchone())",
    "import threading\nout = [0] * 4\ndef work(i): out[i] = sum(range(i * 1000))\n"
    "ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]\n[t.start() for t in ts]; [t.join() for t in ts]\n"
    "print(out)",
    "import os\nopen('w.txt', 'w').write('x' * 10)\nos.rename('w.txt', 'v.txt')\nos.mkdir('dd')\n"
    "print(sorted(os.listdir('.')), os.path.getsize('v.txt'))",
    "import json\njson.dump({'a': [1, 2]}, open('j.json', 'w'))\nprint(json.load(open('j.json')))",
    "import pathlib\np = pathlib.Path('p/q'); p.mkdir(parents=True); (p / 'r.txt').write_text('r')\n"
    "print(sorted(str(x) for x in pathlib.Path('p').rglob('*')))",
    "import shutil, os\nshutil.copytree('sub', 'sub2'); shutil.rmtree('sub'); print(sorted(os.listdir('sub2')))",
    "import zipfile\nwith zipfile.ZipFile('z.zip', 'w') as z: z.write('data.txt')\n"
    "print(zipfile.ZipFile('z.zip').read('data.txt'))",
    "import hashlib\nprint(hashlib.sha256(open('data.txt', 'rb').read()).hexdigest())",
    "import csv\nw = csv.writer(open('c.csv', 'w', newline='')); w.writerows([[1, 'a'], [2, 'b']]); del w\n"
    "print(list(csv.reader(open('c.csv'))))",
    "import os\nfd = os.open('o.txt', os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640); os.write(fd, b'z'); os.close(fd)\n"
    "print(oct(os.stat('o.txt').st_mode & 0o777))\ntry: os.open('o.txt', os.O_CREAT | os.O_EXCL)\n"
    "except FileExistsError as e: print(e)",
    "import os\nos.remove('data.txt')\ntry: open('data.txt')\nexcept FileNotFoundError as e: print(e)",
]

BATTERY: list[list[str]] = [[BASH, "-c", s] for s in SHELL] + [[PY, "-c", c] for c in PYTHON]


def _id(argv: list[str]) -> str:
    return argv[2].replace("\n", "; ")[:60]


def prepare(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A fresh work directory filled by SETUP, and the environment with a clean HOME."""
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    subprocess.run([BASH, "-c", SETUP], cwd=work, check=True, env=DEFAULT_ENV)
    return work, {**DEFAULT_ENV, "HOME": str(home)}


def test_the_battery_is_big_enough() -> None:
    assert len(BATTERY) >= 60 and len({tuple(a) for a in BATTERY}) == len(BATTERY)


@pytest.mark.slow
@pytest.mark.parametrize("argv", BATTERY, ids=_id)
def test_same_as_native(tmp_path: Path, argv: list[str]) -> None:
    work, env = prepare(tmp_path)
    before = tree_digest(tmp_path)
    emulated = run_emulated(argv, env, cwd=work)
    assert tree_digest(tmp_path) == before, "the emulated run changed the host tree"
    native = run_native(argv, env, cwd=work)
    assert emulated.observed() == native.observed()
