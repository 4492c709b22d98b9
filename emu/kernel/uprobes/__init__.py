"""Uprobes: the generic core (registry, consumers, handle_swbp, return instances)
plus the x86 mechanisms (emulation/XOL, call-nop5, jmp slots, lea+call nop10, uretprobe trampolines)."""
