"""`uprobe-emu run`: one binary, one design, optional probes and verifiers; the exit status is the guest's
(a guest killed by a signal: the tool dies of the same signal, the reason on stderr only with -v or --json)."""

from __future__ import annotations

import argparse
import os
import struct
from typing import TYPE_CHECKING

from emu.commands.common import (
    PROG,
    add_binary,
    add_one_design_option,
    add_process_options,
    add_sched_options,
    add_verifier_options,
    check_writable,
    chosen_design,
    guest_env,
    positive_int,
    run_options,
    stderr_line,
    write_json,
)
from emu.errors import UsageError

if TYPE_CHECKING:
    from emu.libprobes import LibraryProbe
    from emu.machine import Attachment, Machine

NAME = "run"
HELP = "run a binary; the exit status is the guest's"


class _CpuInfo(argparse.Action):
    """--cpu-info: print the emulated CPU next to the host's and exit (no binary needed)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help="list the emulated CPU's features next to the "
                         "host's (CPUID, AT_HWCAP, what Unicorn runs) and exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        print(cpu_info(getattr(namespace, "cpus", None) or 1))
        parser.exit(0)


def cpu_info(cpus: int) -> str:
    from emu.cpu import instructions_run
    from emu.cpumodel import FEATURES, CpuModel, feature_rows, host_flags
    from emu.render import table

    model = CpuModel(cpus)
    probed = [f for f in FEATURES if f.probe is not None]
    runs = dict(zip((f.name for f in probed), instructions_run([f.probe for f in probed if f.probe]), strict=True))
    try:
        with open("/proc/cpuinfo") as fh:
            host_text = fh.read()
        with open("/proc/self/auxv", "rb") as fh:
            raw = fh.read()
    except OSError:
        host_text, raw = "", b""
    auxv = dict(struct.iter_unpack("<QQ", raw[: len(raw) // 16 * 16]))
    host = host_flags(host_text)
    names = [line.partition(":")[2].strip() for line in host_text.splitlines() if line.startswith("model name")]
    known = {f.name for f in FEATURES}
    lines = [
        f"emulated: {model.model_name} ({model.vendor}, family {model.signature()[0]} model {model.signature()[1]}), "
        f"{cpus} CPU{'s' if cpus > 1 else ''} (--cpus)",
        f"host:     {names[0] if names else 'unknown'}, {len(names)} CPUs",
        f"AT_HWCAP {model.hwcap:#x} (host {auxv.get(16, 0):#x}), AT_HWCAP2 {model.hwcap2:#x} (host {auxv.get(26, 0):#x})",
        table(feature_rows(model, runs, host)),
        "host flags not modelled: " + " ".join(f for f in host if f not in known),
    ]
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_process_options(p)
    p.add_argument("--cpu-info", action=_CpuInfo)
    p.add_argument("--strace", action="store_true", help="print each syscall on stderr, like strace")
    p.add_argument("--json", metavar="FILE", help="write the run's result as JSON")
    p.add_argument("--save-writes", metavar="DIR",
                   help="after the run, copy the files the guest wrote into DIR (removed names: DIR/.whiteouts)")
    add_one_design_option(p)
    p.add_argument("-p", "--probe", action="append", default=[], metavar="SPEC",
                   help="attach a probe: uprobe:SYM[+OFF], uprobe:0xADDR, uretprobe:SYM, usdt:PROVIDER:NAME, "
                        "uprobe:LIBRARY:SYM")
    p.add_argument("--print-args", action="store_true", help="print each USDT hit with its decoded arguments")
    p.add_argument("--detach-after", type=positive_int, metavar="N",
                   help="remove each probe after its N-th hit (the consumer returns UPROBE_HANDLER_REMOVE)")
    add_sched_options(p)
    add_verifier_options(p, "verifiers to run on every probe hit: redzone,regs,resume,memory (default: none)")
    add_binary(p)


def run(args: argparse.Namespace) -> int:
    from emu.guestio import GuestIO
    from emu.machine import Ending, Machine

    if args.json:
        check_writable(args.json)
    if args.save_writes is not None:
        _check_save_dir(args)
    options = run_options(args, count_insns=bool(args.json), strace=stderr_line if args.strace else None,
                          design=chosen_design(args), sched_quantum=args.sched_quantum, sched_seed=args.sched_seed)
    machine = Machine(args.binary, [args.binary, *args.args], guest_env(args), options, GuestIO.terminal())
    for spec in args.probe:
        _attach(machine, spec, args.print_args, args.detach_after)
    wanted = args.verify or args.shstk or args.rsb is not None
    session = None
    if wanted:
        from emu.verify.session import VerifySession

        session = VerifySession(machine, args.verify or (), shstk=args.shstk, rsb=args.rsb)
    result = machine.run()
    if args.save_writes is not None and machine.kernel.vfs.overlay is not None:
        machine.kernel.vfs.overlay.save(args.save_writes)
    if session is not None:
        session.finish(result.message or result.ending.value, killed=result.signal is not None)
    killed = result.ending is Ending.KILLED and result.signal is not None
    if result.message and (not killed or args.verbose or args.json):  # a native death prints nothing
        stderr_line(f"{PROG}: {result.message}")
    shown: list[Attachment | LibraryProbe] = [a for a in machine.attachments if not a.library]
    shown += machine.library_probes()
    if shown:
        stderr_line(probe_table(shown))
    violations = session.violations if session else []
    for violation in violations:
        stderr_line(f"{PROG}: {violation.line()}")
    if session is not None and session.violations.dropped:
        stderr_line(f"{PROG}: ... {session.violations.dropped:,} more violations, counted but not kept")
    rsb = session.rsb.stats if session is not None and session.rsb is not None else None
    if rsb is not None:
        stderr_line(f"{PROG}: rsb (depth {rsb.depth}): {rsb.returns} returns, {rsb.predicted} predicted, "
                    f"{rsb.mispredicted} mispredicted, {rsb.underflows} underflows")
        for probe, counts in rsb.per_hit.items():
            stderr_line(f"{PROG}: rsb: {probe}: mispredicts after each hit: {counts}")
    if args.json:
        payload = result.to_json()
        payload["violations"] = [v.to_json() for v in violations]
        if rsb is not None:
            payload["rsb"] = rsb.to_json()
        write_json(args.json, payload)
    if killed:
        assert result.signal is not None
        return -int(result.signal)  # the tool dies of it too (cli.die_by_signal)
    return result.exit_status


def _check_save_dir(args: argparse.Namespace) -> None:
    """--save-writes wants a directory that is empty or can be made, and a writable guest."""
    if args.read_only:
        raise UsageError("--save-writes: nothing to save with --read-only")
    target = args.save_writes
    if os.path.exists(target) and (not os.path.isdir(target) or os.listdir(target)):
        raise UsageError(f"--save-writes {target}: not an empty directory")
    try:
        os.makedirs(target, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--save-writes {target}: {exc.strerror}") from None


def _attach(machine: Machine, spec: str, print_args: bool, detach_after: int | None) -> Attachment | LibraryProbe:
    from emu.kernel.uprobes.consumers import UPROBE_HANDLER_REMOVE, Consumer, Hit
    from emu.machine import Attachment

    consumer = Consumer()
    attachment = machine.attach(spec, consumer)
    note = attachment.resolved.usdt if isinstance(attachment, Attachment) else None
    if not (print_args and note is not None) and detach_after is None:
        return attachment  # a counting consumer: the fast path

    def on_hit(hit: Hit) -> int:
        if print_args and note is not None:
            values = [arg.read(hit.regs, hit.read) for arg in note.args]
            stderr_line(f"{spec} @ {hit.address:#x}: " + " ".join(f"arg{i}={v}" for i, v in enumerate(values)))
        # UPROBE_HANDLER_REMOVE after N hits: the kernel unapplies (and unoptimizes) the probe mid-run
        return UPROBE_HANDLER_REMOVE if detach_after is not None and consumer.hits >= detach_after else 0

    consumer.handler = on_hit
    return attachment


def probe_table(attachments: list[Attachment | LibraryProbe]) -> str:
    """Per-probe summary: spec, address, hits, paths taken, optimized."""
    from emu.render import table

    rows: list[tuple[str, ...]] = [("probe", "address", "hits", "path", "optimized")]
    for att in attachments:
        s = att.summary()
        paths = ",".join(f"{k}:{v}" for k, v in sorted(s["paths"].items())) or "-"
        address = f"{s['address']:#x}" if s["address"] is not None else "not mapped"
        rows.append((s["spec"], address, str(s["hits"]), paths, "yes" if s["optimized"] else "no"))
    return table(rows)
