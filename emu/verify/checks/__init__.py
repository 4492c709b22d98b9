"""The per-hit checks, one module each: each takes a finished Transaction (emu/verify/records.py) and
its reference (emu/verify/expected.py) and returns the violations it proves."""
