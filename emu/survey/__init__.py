"""`uprobe-emu survey`: every probe site of a set of ELF files, its red zone, and each design's hazard.

- stack.py    what an instruction does to the stack (entry-relative addresses)
- redzone.py  a function's control flow and the live red-zone bytes across a site
- writes.py   the red-zone bytes a design writes, from the design's own code
- analyze.py  one file: sites, verdicts, hazards (runs as a task)
"""
