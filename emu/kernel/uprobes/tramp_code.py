"""Byte sequences of every trampoline the designs map (spec 1.3, 1.4, 1.5; DESIGN.md)."""

from __future__ import annotations

# [uprobes-trampoline], Linux 6.18 (spec 1.3): push rcx; push r11; push rax; mov $336,%rax; syscall;
# pop rax; pop r11; pop rcx; ret; int3
NOP5_TRAMPOLINE = bytes.fromhex("5141535048c7c0500100000f0558415b59c3cc")
NOP5_SYSCALL_RETURN = 0x0D  # regs->ip inside the trampoline after its syscall

# nop10 (spec 1.5): the same, ending `ret $0x80`
NOP10_TRAMPOLINE = bytes.fromhex("5141535048c7c0500100000f0558415b59c28000cc")

# jmp-slots: lea -128(%rsp),%rsp; push rcx; push r11; push rax; mov $336,%eax; syscall (16 bytes)
JMP_SLOT = bytes.fromhex("488d642480514153 50b8500100000f05".replace(" ", ""))
JMP_SLOT_SIZE = 16
SLOTS_PER_PAGE = 4096 // JMP_SLOT_SIZE

# [uprobes] slot 0 uretprobe trampolines
URETPROBE_335 = bytes.fromhex("50514153" "48c7c04f010000" "0f05" "415b59c3cc")
URETPROBE_335_CHECK = 0x0D
URETPROBE_RFC_462 = bytes.fromhex("50514153" "48c7c0ce010000" "0f05" "cc")
URETPROBE_RFC_CHECK = 0x0D
URETPROBE_INT3 = bytes.fromhex("cc")

assert len(JMP_SLOT) == JMP_SLOT_SIZE
