"""`uprobe-emu diff`: the same binary and probes under the host kernel and under emulation.

Native probes are attached through perf_event_open on the uprobe PMU (emu/native.py); the
emulated run uses the design that matches the host (linux-6.18 here). Like is compared with like:
the native process runs with randomization off (personality ADDR_NO_RANDOMIZE), as the emulated
one is laid out, from the same path and argv, so addresses compare exactly. Compared: stdout,
stderr, exit status, the hit count of every probe, the probe sites' bytes at exit (the rel32 of
an optimized call included, so the trampoline's address) and /proc/self/maps at exit, line by line
(where [uprobes-trampoline] and [uprobes] were mapped).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from emu.cpumodel import DEFAULT_CPUS
from emu.errors import UsageError
from emu.guestio import GuestIO
from emu.kernel.dispatch import KernelConfig
from emu.kernel.procfs import render_maps
from emu.kernel.uprobes.sites import usdt_combo_site
from emu.machine import Machine, RunOptions
from emu.native import NativeProbe, NativeRun, run_native
from emu.probes import ProbeKind, Resolver, parse_spec
from emu.process.loader import LoadedImage


@dataclass(frozen=True, slots=True)
class DiffReport:
    native: NativeRun
    stdout: bytes
    stderr: bytes
    exit_status: int
    hits: tuple[int, ...]
    specs: tuple[str, ...]
    sites: tuple[bytes, ...]  # the probe sites' bytes when the emulated guest exited
    maps: str = ""  # the emulated /proc/self/maps when the guest exited

    def first_difference(self) -> str | None:
        native_status = self.native.returncode if self.native.returncode >= 0 else 128 - self.native.returncode
        for what, want_out, got_out in (("stdout", self.native.stdout, self.stdout),
                                        ("stderr", self.native.stderr, self.stderr)):
            if want_out != got_out:
                return f"{what} {_first_line_difference(want_out, got_out)}"
        if native_status != self.exit_status:
            return f"exit status: native {native_status}, emulated {self.exit_status}"
        for spec, want, got in zip(self.specs, self.native.counts, self.hits, strict=True):
            if want != got:
                return f"hits of {spec}: native {want}, emulated {got}"
        for spec, want_bytes, got_bytes in zip(self.specs, self.native.site_bytes, self.sites, strict=True):
            if want_bytes != got_bytes:
                return f"site bytes of {spec} at exit: native {want_bytes.hex()}, emulated {got_bytes.hex()}"
        if self.native.maps and self.native.maps != self.maps:
            return f"/proc/self/maps at exit {_first_line_difference(self.native.maps.encode(), self.maps.encode())}"
        return None


def _first_line_difference(native: bytes, emulated: bytes) -> str:
    a, b = native.splitlines(), emulated.splitlines()
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"line {i + 1}: native {x!r}, emulated {y!r}"
    i = min(len(a), len(b))
    return f"line {i + 1}: native {'has' if len(a) > i else 'lacks'} more output ({len(a)} against {len(b)} lines)"


def _file_offset(image: LoadedImage, vaddr: int) -> int:
    offset = image.plan.file_offset(vaddr - image.bias)
    if offset is None:
        raise UsageError(f"{vaddr:#x} is not backed by {image.plan.file.path}")
    return offset


def native_probe(machine: Machine, spec_text: str) -> NativeProbe:
    """Where the host kernel must put the probe: file offset (+ semaphore offset) in the executable."""
    spec = parse_spec(spec_text)
    if spec.path is not None:
        raise UsageError(f"{spec_text}: diff probes the executable only")
    resolved = Resolver(machine.exe).resolve(spec)
    address = resolved.address
    if resolved.usdt is not None:  # libbpf's nop-combo rule, as on this kernel
        address = usdt_combo_site(machine.mem.read(address, 16), address, machine.design)
    ref = _file_offset(machine.exe, resolved.semaphore) if resolved.semaphore else 0
    return NativeProbe(os.path.realpath(machine.path), _file_offset(machine.exe, address),
                       spec.kind is ProbeKind.URETPROBE, ref)


def run_diff(binary: str, argv: Sequence[str], specs: Sequence[str], env: dict[str, str],
             design: str = "linux-6.18", stdin: bytes = b"", cpus: int = DEFAULT_CPUS,
             aslr: int | None = None) -> DiffReport:
    """``aslr``: emulate with the layout randomized from this seed and run natively with ASLR on;
    addresses then differ by design and /proc/self/maps is not compared."""
    io = GuestIO.captured(stdin)
    machine = Machine(binary, list(argv), env, RunOptions(kernel=KernelConfig(cpus=cpus), design=design, aslr=aslr), io)
    natives = [native_probe(machine, s) for s in specs]
    attachments = [machine.attach(s) for s in specs]
    length = machine.design.site_length
    native = run_native([binary, *argv[1:]], natives, env=env, stdin=stdin,
                        peek=[(p.offset, length) for p in natives], no_aslr=aslr is None, maps=aslr is None)
    result = machine.run()
    hits = tuple(int(a.summary()["hits"]) for a in attachments)
    sites = tuple(machine.mem.read(int(a.summary()["address"]), length) for a in attachments)
    maps = render_maps(list(machine.mem))
    return DiffReport(native, bytes(io.out), bytes(io.err), result.exit_status, hits, tuple(specs), sites, maps)
