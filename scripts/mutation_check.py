#!/usr/bin/env python
"""Make each known bug in a copy of the template, one at a time, and run the tests that must catch it.

Prints one line per mutant as it is checked (caught or MISSED, by which test, in how long) and exits
with the number missed. The list is ``tests/mutants.py``; ``docs/tests.md`` says which promise each keeps.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def main() -> int:
    parser = argparse.ArgumentParser(prog="mutation_check.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="mutants to check (default: all)")
    args = parser.parse_args()
    from mutants import MUTANTS, check, copy_template

    unknown = [name for name in args.names if name not in {m.name for m in MUTANTS}]
    if unknown:
        parser.error(f"unknown mutant {unknown[0]!r}; known: {', '.join(m.name for m in MUTANTS)}")
    import tempfile

    missed = 0
    with tempfile.TemporaryDirectory(prefix="mutants-") as scratch:
        template = copy_template(Path(scratch) / "template")
        for mutant in (m for m in MUTANTS if not args.names or m.name in args.names):
            outcome = check(mutant, template)
            missed += not outcome.caught
            state = "caught" if outcome.caught else "MISSED"
            print(f"{state:6}  {mutant.name:44} {outcome.seconds:6.1f} s  {outcome.by}", flush=True)
    print(f"{missed} missed" if missed else "every mutant caught")
    return missed


if __name__ == "__main__":
    sys.exit(main())
