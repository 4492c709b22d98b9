"""The one CPU model a guest sees, told the same way through every channel it can read.

CPUID (served by a hook, so Unicorn's own answer never reaches the guest), AT_HWCAP,
AT_HWCAP2, AT_MINSIGSTKSZ, /proc/cpuinfo and /sys/devices/system/cpu are all derived from
the leaves below and from the CPU count.

The leaves are Unicorn 2.1.4's default x86-64 model ("Intel Core Processor (Haswell)", with
the features its TCG code generator cannot run already filtered out by Unicorn), corrected
where Unicorn itself says more than it runs: leaf 0xd advertises the AVX state component
(XCR0 bit 2) and its 256-byte save area although no AVX instruction decodes (measured:
``vaddps %ymm1,%ymm0,%ymm0`` is an invalid instruction, and xgetbv says XCR0 = 3). Every
feature advertised here that a user program can execute has a probe instruction;
tests/test_cpu_model.py runs each on a scratch Unicorn, and ``run --cpu-info`` does so live.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

MAX_CPUS = 256  # NR_CPUS of the modelled kernel: /sys/devices/system/cpu/kernel_max says 255
DEFAULT_CPUS = 1  # the emulator runs every thread of a process on one CPU, in turn (kernel/sched.py)

# The size of the XSAVE area for XCR0 = x87|SSE (the legacy 512 bytes and the 64-byte header).
XSAVE_SIZE = 0x240
XCR0 = 0x3
FP_XSTATE_MAGIC2_SIZE = 4
# AT_MINSIGSTKSZ grows byte for byte with the XSAVE area (arch/x86/kernel/signal.c init_sigframe_size):
# Linux 6.18 says 1776 for an 832-byte area, 3376 for 2432. Signal frames use the host kernel's area
# (kernel/hostframe.py); this is the model's own, for a host where that cannot be measured.
MIN_SIGSTKSZ = 1776 - 832 + XSAVE_SIZE
HWCAP2_FSGSBASE = 1 << 1  # arch/x86/include/uapi/asm/hwcap2.h: the kernel lets user code run rd/wrfsbase


class R(enum.IntEnum):
    """A CPUID output register, as an index into the (eax, ebx, ecx, edx) tuple."""

    EAX = 0
    EBX = 1
    ECX = 2
    EDX = 3


@dataclass(frozen=True, slots=True)
class Feature:
    """One CPUID feature bit, named as /proc/cpuinfo names it."""

    name: str
    leaf: int
    reg: R
    bit: int
    probe: bytes | None  # an instruction that needs the feature; None: not something user code executes
    subleaf: int = 0
    shown: bool = True  # listed in /proc/cpuinfo's flags (Linux hides a few, e.g. osxsave)


def _f(name: str, leaf: int, reg: R, bit: int, probe: str | None = None, subleaf: int = 0,
       shown: bool = True) -> Feature:
    return Feature(name, leaf, reg, bit, bytes.fromhex(probe) if probe else None, subleaf, shown)


# In /proc/cpuinfo's order (Linux lists the words of x86_capability in this order). The probes are
# assembled with GNU as; memory operands use (%rsp), which the prober points at a scratch page.
FEATURES: tuple[Feature, ...] = (
    _f("fpu", 1, R.EDX, 0, "d9e8"),  # fld1
    _f("vme", 1, R.EDX, 1), _f("de", 1, R.EDX, 2), _f("pse", 1, R.EDX, 3),
    _f("tsc", 1, R.EDX, 4, "0f31"),  # rdtsc
    _f("msr", 1, R.EDX, 5), _f("pae", 1, R.EDX, 6), _f("mce", 1, R.EDX, 7),
    _f("cx8", 1, R.EDX, 8, "0fc70c24"),  # cmpxchg8b (%rsp)
    _f("apic", 1, R.EDX, 9), _f("sep", 1, R.EDX, 11), _f("mtrr", 1, R.EDX, 12), _f("pge", 1, R.EDX, 13),
    _f("mca", 1, R.EDX, 14),
    _f("cmov", 1, R.EDX, 15, "480f44d8"),  # cmove %rax,%rbx
    _f("pat", 1, R.EDX, 16), _f("pse36", 1, R.EDX, 17),
    _f("clflush", 1, R.EDX, 19, "0fae3c24"),  # clflush (%rsp)
    _f("mmx", 1, R.EDX, 23, "0ffcc1"),  # paddb %mm1,%mm0
    _f("fxsr", 1, R.EDX, 24, "480fae0424"),  # fxsave64 (%rsp)
    _f("sse", 1, R.EDX, 25, "0f58c1"),  # addps %xmm1,%xmm0
    _f("sse2", 1, R.EDX, 26, "660f58c1"),  # addpd %xmm1,%xmm0
    _f("ht", 1, R.EDX, 28),
    _f("syscall", 0x80000001, R.EDX, 11),  # runs through the emulated kernel's syscall hook
    _f("nx", 0x80000001, R.EDX, 20),
    _f("pdpe1gb", 0x80000001, R.EDX, 26),
    _f("rdtscp", 0x80000001, R.EDX, 27, "0f01f9"),
    _f("lm", 0x80000001, R.EDX, 29),
    _f("pni", 1, R.ECX, 0, "f20f7cc1"),  # haddps %xmm1,%xmm0
    _f("pclmulqdq", 1, R.ECX, 1, "660f3a44c100"),
    _f("monitor", 1, R.ECX, 3),
    _f("ssse3", 1, R.ECX, 9, "660f3800c1"),  # pshufb
    _f("fma", 1, R.ECX, 12, "c4e26998c1"),  # vfmadd132ps %xmm1,%xmm2,%xmm0
    _f("cx16", 1, R.ECX, 13, "480fc70c24"),  # cmpxchg16b (%rsp)
    _f("pcid", 1, R.ECX, 17),
    _f("sse4_1", 1, R.ECX, 19, "660f3a0ec100"),  # pblendw
    _f("sse4_2", 1, R.ECX, 20, "660f3837c1"),  # pcmpgtq
    _f("x2apic", 1, R.ECX, 21),
    _f("movbe", 1, R.ECX, 22, "0f38f00424"),  # movbe (%rsp),%eax
    _f("popcnt", 1, R.ECX, 23, "f3480fb8c3"),
    _f("tsc_deadline_timer", 1, R.ECX, 24),
    _f("aes", 1, R.ECX, 25, "660f38dcc1"),  # aesenc
    _f("xsave", 1, R.ECX, 26, "0fae2424"),  # xsave (%rsp), with edx:eax = XCR0
    _f("osxsave", 1, R.ECX, 27, "0f01d0", shown=False),  # xgetbv: CR4.OSXSAVE set by the kernel
    _f("avx", 1, R.ECX, 28, "c5fc58c1"),  # vaddps %ymm1,%ymm0,%ymm0
    _f("f16c", 1, R.ECX, 29, "c4e27913c1"),  # vcvtph2ps
    _f("rdrand", 1, R.ECX, 30, "480fc7f0"),
    _f("hypervisor", 1, R.ECX, 31),
    _f("lahf_lm", 0x80000001, R.ECX, 0, "9f"),  # lahf in 64-bit mode
    _f("abm", 0x80000001, R.ECX, 5, "f3480fbdd8"),  # lzcnt
    _f("sse4a", 0x80000001, R.ECX, 6, "660f78c00000"),  # extrq
    _f("3dnowprefetch", 0x80000001, R.ECX, 8, "0f0d0c24"),  # prefetchw
    _f("fsgsbase", 7, R.EBX, 0, "f3480faec0"),  # rdfsbase %rax
    _f("bmi1", 7, R.EBX, 3, "c4e2e0f2c8"),  # andn
    _f("avx2", 7, R.EBX, 5, "c5fdfec1"),  # vpaddd %ymm1,%ymm0,%ymm0
    _f("smep", 7, R.EBX, 7),
    _f("bmi2", 7, R.EBX, 8, "c4e2f9f7cb"),  # shlx
    _f("erms", 7, R.EBX, 9, "f3a4"),  # rep movsb
    _f("invpcid", 7, R.EBX, 10),
    _f("avx512f", 7, R.EBX, 16, "62f17d48fec1"),  # vpaddd %zmm1,%zmm0,%zmm0
    _f("rdseed", 7, R.EBX, 18, "480fc7f8"),
    _f("adx", 7, R.EBX, 19, "66480f38f6d8"),  # adcx
    _f("smap", 7, R.EBX, 20),
    _f("clflushopt", 7, R.EBX, 23, "660fae3c24"),
    _f("clwb", 7, R.EBX, 24, "660fae3424"),
    _f("sha_ni", 7, R.EBX, 29, "0f38c8c1"),  # sha1nexte
    _f("xsaveopt", 0xD, R.EAX, 0, "0fae3424", subleaf=1),  # xsaveopt (%rsp)
    _f("xsavec", 0xD, R.EAX, 1, "0fc72424", subleaf=1),  # xsavec (%rsp)
    _f("xgetbv1", 0xD, R.EAX, 2, "b9010000000f01d0", subleaf=1),  # xgetbv with ecx = 1
    _f("arat", 6, R.EAX, 2),
    _f("umip", 7, R.ECX, 2),
    _f("vaes", 7, R.ECX, 9, "c4e27ddcc1"),  # vaesenc %ymm1,%ymm0,%ymm0
    _f("vpclmulqdq", 7, R.ECX, 10, "c4e37d44c100"),
    _f("rdpid", 7, R.ECX, 22, "f30fc7f8"),
)
BY_NAME = {f.name: f for f in FEATURES}

# Unicorn 2.1.4's answers (leaf, subleaf) -> eax, ebx, ecx, edx, as a scratch engine gives them, with the
# corrections named. Leaves missing here but within the maximum read as zeros.
_VENDOR = (0x756E6547, 0x6C65746E, 0x49656E69)  # "Genu", "ntel", "ineI": ebx, ecx, edx spell "GenuineIntel"
LEAVES: dict[tuple[int, int], tuple[int, int, int, int]] = {
    (0x0, 0): (0xD, *_VENDOR),
    (0x1, 0): (0x000306C4, 0x00000800, 0xCED82203, 0x078BFBFD),  # ebx: CPU count and APIC id set per model
    (0x2, 0): (0x00000001, 0, 0, 0x002C307D),
    (0x4, 0): (0x00000121, 0x01C0003F, 0x0000003F, 0x00000001),  # eax 31:26: cores - 1, set per model
    (0x4, 1): (0x00000122, 0x01C0003F, 0x0000003F, 0x00000001),
    (0x4, 2): (0x00000143, 0x03C0003F, 0x00000FFF, 0x00000001),
    (0x5, 0): (0, 0, 0x00000003, 0),
    (0x6, 0): (0x00000004, 0, 0, 0),
    (0x7, 0): (0, 0x00000389, 0, 0),
    (0xD, 0): (XCR0, XSAVE_SIZE, XSAVE_SIZE, 0),  # Unicorn: 7, 0x240, 0x340 (the AVX state it cannot run)
    (0xD, 1): (0x00000001, 0, 0, 0),
    # (0xd, 2), the AVX state component (Unicorn: 0x100 bytes at 0x240): zeros, as for any absent component
    (0x80000000, 0): (0x80000008, *_VENDOR),
    (0x80000001, 0): (0x000306C4, 0, 0x00000021, 0x28100800),
    (0x80000002, 0): (0x65746E49, 0x6F43206C, 0x50206572, 0x65636F72),  # "Intel Core Processor (Haswell)"
    (0x80000003, 0): (0x726F7373, 0x61482820, 0x6C657773, 0x0000296C),
    (0x80000004, 0): (0, 0, 0, 0),
    (0x80000005, 0): (0x01FF01FF, 0x01FF01FF, 0x40020140, 0x40020140),
    (0x80000006, 0): (0, 0x42004200, 0x02008140, 0),
    (0x80000008, 0): (0x00003028, 0, 0, 0),  # 40 physical, 48 virtual address bits
}
UNICORN_CORRECTIONS: dict[tuple[int, int], tuple[int, int, int, int]] = {
    (0xD, 0): (0x7, 0x240, 0x340, 0),
    (0xD, 2): (0x100, 0x240, 0, 0),
}
"""What Unicorn's own CPUID says where LEAVES differ from it (a test keeps this list exact)."""
VARIABLE = {(0x1, 0): (R.EBX,), (0x4, 0): (R.EAX,), (0x4, 1): (R.EAX,), (0x4, 2): (R.EAX,)}
"""Registers that depend on the CPU count (so differ from Unicorn's one-CPU answer when it is not 1)."""
HTT_BIT = 28


@dataclass(frozen=True, slots=True)
class CpuModel:
    """The emulated CPU, ``cpus`` of them."""

    cpus: int = DEFAULT_CPUS
    leaves: Mapping[tuple[int, int], tuple[int, int, int, int]] = field(default_factory=lambda: LEAVES, repr=False)

    def __post_init__(self) -> None:
        if not 1 <= self.cpus <= MAX_CPUS:
            raise ValueError(f"cpus must be 1..{MAX_CPUS}, got {self.cpus}")

    def cpuid(self, leaf: int, subleaf: int) -> tuple[int, int, int, int]:
        """What the CPUID instruction returns (as an Intel CPU does past the maximum leaves: the
        highest basic leaf's answer)."""
        leaf &= 0xFFFFFFFF
        basic_max, ext_max = self.leaves[(0, 0)][0], self.leaves[(0x80000000, 0)][0]
        if 0x40000000 <= leaf < 0x80000000 and leaf > basic_max:
            return (0, 0, 0, 0) if leaf < 0x50000000 else self.cpuid(basic_max, subleaf)
        if basic_max < leaf < 0x40000000 or leaf > ext_max:
            leaf = basic_max
        if leaf not in (0x4, 0x7, 0xB, 0xD):
            subleaf = 0  # leaves without subleaves ignore ecx
        eax, ebx, ecx, edx = self.leaves.get((leaf, subleaf & 0xFFFFFFFF), (0, 0, 0, 0))
        if leaf == 1:
            # ebx 23:16: addressable logical processors; ht (edx 28) says that field is meaningful
            ebx = (ebx & 0xFF00FFFF) | (min(self.cpus, 255) << 16 if self.cpus > 1 else 0)
            edx = edx | (1 << HTT_BIT) if self.cpus > 1 else edx
        elif leaf == 4 and eax & 0x1F:
            eax = (eax & 0x03FFFFFF) | ((min(self.cpus, 64) - 1) << 26)  # cores per package - 1
        return eax, ebx, ecx, edx

    def has(self, feature: Feature) -> bool:
        return bool(self.cpuid(feature.leaf, feature.subleaf)[feature.reg] >> feature.bit & 1)

    def features(self) -> Iterator[Feature]:
        return (f for f in FEATURES if self.has(f))

    @property
    def hwcap(self) -> int:
        """AT_HWCAP: x86 hands user space CPUID(1).edx (ELF_HWCAP, boot_cpu_data.x86_capability[0])."""
        return self.cpuid(1, 0)[R.EDX]

    @property
    def hwcap2(self) -> int:
        """AT_HWCAP2: FSGSBASE when the CPU has it (Linux >= 5.9 enables it for user code)."""
        return HWCAP2_FSGSBASE if self.has(BY_NAME["fsgsbase"]) else 0

    @property
    def model_name(self) -> str:
        raw = b"".join(w.to_bytes(4, "little") for leaf in (0x80000002, 0x80000003, 0x80000004)
                       for w in self.cpuid(leaf, 0))
        return raw.split(b"\0", 1)[0].decode("ascii").strip()

    @property
    def vendor(self) -> str:
        _, ebx, ecx, edx = self.cpuid(0, 0)
        return b"".join(w.to_bytes(4, "little") for w in (ebx, edx, ecx)).decode("ascii")

    def signature(self) -> tuple[int, int, int]:
        """family, model, stepping as Linux computes them from leaf 1 eax (cpu/common.c x86_family/x86_model)."""
        eax = self.cpuid(1, 0)[R.EAX]
        family = (eax >> 8) & 0xF
        model = (eax >> 4) & 0xF
        if family == 0xF:
            family += (eax >> 20) & 0xFF
        if family >= 6:
            model += ((eax >> 16) & 0xF) << 4
        return family, model, eax & 0xF

    def flags(self) -> list[str]:
        return [f.name for f in self.features() if f.shown]

    def cpuinfo(self) -> str:
        """/proc/cpuinfo, one block per CPU as show_cpuinfo() prints it (lines the model has no value
        for, such as cpu MHz and bogomips, are left out)."""
        family, model, stepping = self.signature()
        phys, virt = self.cpuid(0x80000008, 0)[R.EAX] & 0xFF, (self.cpuid(0x80000008, 0)[R.EAX] >> 8) & 0xFF
        clflush = ((self.cpuid(1, 0)[R.EBX] >> 8) & 0xFF) * 8
        blocks = []
        for n in range(self.cpus):
            blocks.append(
                f"processor\t: {n}\nvendor_id\t: {self.vendor}\ncpu family\t: {family}\nmodel\t\t: {model}\n"
                f"model name\t: {self.model_name}\nstepping\t: {stepping}\nphysical id\t: 0\n"
                f"siblings\t: {self.cpus}\ncore id\t\t: {n}\ncpu cores\t: {self.cpus}\napicid\t\t: {n}\n"
                f"initial apicid\t: {n}\nfpu\t\t: yes\nfpu_exception\t: yes\n"
                f"cpuid level\t: {self.cpuid(0, 0)[R.EAX]}\nwp\t\t: yes\nflags\t\t: {' '.join(self.flags())}\n"
                f"bugs\t\t:\nclflush size\t: {clflush}\ncache_alignment\t: {clflush}\n"
                f"address sizes\t: {phys} bits physical, {virt} bits virtual\npower management:\n\n"
            )
        return "".join(blocks)

    def cpu_list(self, mask: int | None = None) -> str:
        """The kernel's cpulist format (``%*pbl``) of ``mask`` (default every CPU): ``0``, ``0-3``, ``0,2-3``."""
        bits = self.affinity_mask() if mask is None else mask
        ranges: list[str] = []
        n = 0
        while n < self.cpus:
            if bits >> n & 1:
                end = n
                while end + 1 < self.cpus and bits >> (end + 1) & 1:
                    end += 1
                ranges.append(str(n) if end == n else f"{n}-{end}")
                n = end + 1
            else:
                n += 1
        return ",".join(ranges)

    def affinity_mask(self) -> int:
        return (1 << self.cpus) - 1

    def affinity_hex(self, mask: int | None = None) -> str:
        """``mask`` (default every CPU) as /proc/<pid>/status prints it (``%*pb`` over nr_cpu_ids bits):
        hex, 32 bits a group."""
        digits = f"{self.affinity_mask() if mask is None else mask:0{(self.cpus + 3) // 4}x}"
        groups: list[str] = []
        while digits:
            groups.insert(0, digits[-8:])
            digits = digits[:-8]
        return ",".join(groups)


def advertised_unrunnable(model: CpuModel) -> list[str]:
    """The features ``model`` advertises whose probe instruction Unicorn does not run (should be none)."""
    from emu.cpu import instructions_run

    probed = [f for f in model.features() if f.probe is not None]
    runs = instructions_run([f.probe for f in probed if f.probe is not None])
    return [f.name for f, ok in zip(probed, runs, strict=True) if not ok]


def host_flags(cpuinfo: str) -> list[str]:
    """The flags of the first CPU in a /proc/cpuinfo text."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return value.split()
    return []


def feature_rows(model: CpuModel, runs: dict[str, bool], host: list[str]) -> list[tuple[str, str, str, str]]:
    """One row a known feature: name, in the emulated CPUID, runs under Unicorn (probe), on the host."""
    shown = set(host)
    rows = [("feature", "emulated", "runs here", "host")]
    for feature in FEATURES:
        run = "-" if feature.probe is None else "yes" if runs.get(feature.name) else "no"
        on_host = "yes" if feature.name in shown else "no" if feature.shown else "-"
        rows.append((feature.name, "yes" if model.has(feature) else "no", run, on_host))
    return rows
