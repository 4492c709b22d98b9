"""`uprobe-emu mutate`: flawed variants of optimizing designs, each run with the verifiers on a
program that keeps everything live across its probe sites; the score says how many they caught."""

from __future__ import annotations

import argparse

from emu.commands.common import check_writable, write_json

NAME = "mutate"
HELP = "mutation-test the verifiers: flawed variants of each optimizing design, and which ones are caught"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--design", action="append", default=[], metavar="NAME",
                   help="an optimizing design to mutate (repeatable; default: every built-in optimizing "
                        "design, or the --design-file ones)")
    p.add_argument("--design-file", action="append", default=[], metavar="FILE.py",
                   help="load designs from a Python file (emu.designs API); its optimizing designs are mutated "
                        "unless --design names others. Repeatable")
    p.add_argument("--operator", action="append", default=[], metavar="OP",
                   help="only this mutation operator (repeatable; default all)")
    p.add_argument("--json", metavar="FILE", help="write every mutant's outcome as JSON")
    p.add_argument("--strict", action="store_true", help="exit 1 unless every design scores 100%% with no false alarm")


def run(args: argparse.Namespace) -> int:
    from emu.designs import DESIGNS, get_design
    from emu.designs.file import load_design_files
    from emu.errors import UsageError
    from emu.mutation import OPERATORS, Outcome, optimizing, score_design, score_table, survivors_text

    unknown = [op for op in args.operator if op not in OPERATORS]
    if unknown:
        raise UsageError(f"--operator {', '.join(unknown)}: unknown (known: {', '.join(OPERATORS)})")
    if args.json:
        check_writable(args.json)
    loaded = load_design_files(args.design_file)
    if args.design:
        designs = [get_design(name) for name in args.design]
    else:
        designs = optimizing({d.name: d for d in loaded}) if loaded else optimizing(DESIGNS)
    if not designs:
        raise UsageError("no optimizing design to mutate (INT3-only designs have no trampoline)")
    scores = [score_design(d, operators=args.operator or None) for d in designs]
    print(score_table(scores))
    lines = survivors_text(scores)
    if lines:
        print("\nmutants not caught as they should be (survived: the run changed and no verifier said so; "
              "unseen: nothing changed that the program or a verifier could see; false alarm: an equivalent "
              "mutant flagged):")
        print("\n".join(lines))
    if args.json:
        write_json(args.json, {"designs": {s.design: {
            "score": s.score(), "perfect": s.perfect,
            "operators": {op: {"score": s.score(op), **{o.value: s.count(o, op) for o in Outcome}}
                          for op in s.operators()},
            "mutants": [r.to_json() for r in s.results]} for s in scores}})
    return 1 if args.strict and not all(s.perfect for s in scores) else 0
