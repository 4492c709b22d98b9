"""uprobe-emu: run x86-64 Linux ELF binaries under Unicorn on a small fake kernel."""

__version__ = "0.1.0"
