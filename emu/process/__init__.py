"""One process's image and how it runs: the ELF (elf.py) loaded as execve loads it (loading.py,
loader.py, initstack.py, layout.py, scripts.py for #! files), its memory (memory.py, vma.py), and the
run loop with its clock (runloop.py, timekeeping.py, icount.py). emu/machine.py puts them together."""
