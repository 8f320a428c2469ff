"""``tests/mutants.py`` stays usable as the code moves: each mutant has its own name, an original found exactly once
where it says, and tests that exist (a mutant whose edit no longer applies would prove nothing)."""

import re

from mutants import MUTANTS

from helpers import ROOT


def test_each_mutant_has_its_own_name():
    names = [m.name for m in MUTANTS]
    assert sorted({n for n in names if names.count(n) > 1}) == []


def test_each_mutants_edit_applies_where_it_says():
    misplaced = [m.name for m in MUTANTS if (ROOT / m.file).read_text(encoding="utf-8").count(m.original) != 1]
    assert misplaced == []


def test_each_mutants_tests_exist():
    missing = []
    for mutant in MUTANTS:
        for node in mutant.tests:
            path, _, name = node.partition("::")
            function = re.sub(r"\[.*\]$", "", name)
            if f"def {function}(" not in (ROOT / path).read_text(encoding="utf-8"):
                missing.append(f"{mutant.name}: {node}")
    assert missing == []


def test_each_mutated_python_file_still_compiles():
    """A mutant that breaks the syntax is caught by any test that imports its file: it would prove nothing."""
    broken = []
    for mutant in MUTANTS:
        if mutant.file.endswith(".py"):
            source = (ROOT / mutant.file).read_text(encoding="utf-8").replace(mutant.original, mutant.mutated)
            try:
                compile(source, mutant.file, "exec")
            except SyntaxError as err:
                broken.append(f"{mutant.name}: {err.msg} at line {err.lineno}")
    assert broken == []
