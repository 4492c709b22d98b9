"""Verifiers hooked into a run: red zone, registers, resume, lockstep. Violations are structured records."""
