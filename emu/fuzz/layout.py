"""Where everything of a fuzz program lives: the same addresses natively and emulated.

A static, non-PIE ELF: code at CODE_BASE (the fixed driver, then the case's leaf function at
FUNC), data at DATA_BASE (the inputs the driver loads, the function's scratch block, and the
results the program writes to stdout before exiting 0).
"""

from __future__ import annotations

CODE_BASE = 0x401000
CODE_SIZE = 0x2000
FUNC = CODE_BASE + 0x400  # the leaf function (the driver fits below it)
DATA_BASE = 0x600000
DATA_SIZE = 0x2000

REGS_TABLE = DATA_BASE  # 15 register values (CASE_REGS order), then the flags
FLAGS_SLOT = REGS_TABLE + 15 * 8
VALUES = DATA_BASE + 0x100  # 16 bytes per store: what it writes
STASH = DATA_BASE + 0x200  # the function's rsp at entry (it restores it before ret)
SCRATCH = DATA_BASE + 0x300  # the function's result block for the current call
RESULTS = DATA_BASE + 0x800  # one block per call, copied from SCRATCH by the driver

CALLS = 2  # 6.18 optimizes on the first hit: the red zone breaks from the second on
BLOCK = 0x110
BLOCK_REGS = 0  # 15 registers, 8 bytes each
BLOCK_FLAGS = 0x78  # lahf's ah (SF ZF AF PF CF) and seto's al, 2 bytes
BLOCK_SP_DELTA = 0x80  # rsp after the site minus rsp at entry
BLOCK_READS = 0x88  # 16 bytes per store read back
RESULTS_SIZE = CALLS * BLOCK
