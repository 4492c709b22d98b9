"""The per-hit verifiers: red zone, registers, resume and memory effects, judged per probe hit (a transaction)."""
