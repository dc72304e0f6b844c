"""The manual's guarantees table (docs/guarantees.md) against the tests and the mutants: every test a row names
exists, every mutant of `make mutants` breaks a test some row names (and the row says which mutants those are), and
a row without a mutant is counted, so that a new promise without one is a red test rather than a forgotten one."""

import ast

import guarantees  # scripts/ (conftest puts it on the path)
import mutants
import pytest
from conftest import ROOT

# The template's own bookkeeping: `make check-manual` (the template's CI) runs these, `make test` does not.
pytestmark = pytest.mark.manual

# Rows whose promise no mutant breaks yet ("none yet"). It may only fall: give a new row a mutant
# (scripts/mutants.py) that its test kills. A row no mutant here can break says why instead (guarantees.EXEMPT).
UNGUARDED_AT_MOST = 0


def guarantee_rows() -> list[tuple[str, set[guarantees.Ref], list[str]]]:
    return guarantees.guarantee_rows(ROOT)


def guards(mutant: mutants.Mutant, row_tests: set[guarantees.Ref]) -> bool:
    return guarantees.guards(mutant.tests, row_tests)


def test_every_test_a_guarantee_names_exists() -> None:
    missing = []
    for promise, tests, _ in guarantee_rows():
        assert tests, f"the row names no test: {promise[:80]}"
        for file, function in tests:
            path = ROOT / "tests" / file
            source = path.read_text() if path.is_file() else ""
            defined = {n.name for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef)}
            if not path.is_file() or (function is not None and function not in defined):
                missing.append(f"{file}::{function}" if function else file)
    assert not missing, f"the guarantees table names tests that do not exist: {missing}"


def test_every_mutant_breaks_a_promise_the_table_names_and_every_promise_names_its_mutants() -> None:
    by_name = {m.name: m for m in mutants.MUTANTS}
    rows = guarantee_rows()
    for promise, tests, named in rows:
        unknown = [n for n in named if n not in by_name]
        assert not unknown, f"{unknown}: not mutants of scripts/mutants.py (row: {promise[:80]})"
        # The column says exactly which mutants run one of the row's tests: it cannot lie, nor go stale.
        assert named == [m.name for m in mutants.MUTANTS if guards(m, tests)], promise[:80]
    orphans = [m.name for m in mutants.MUTANTS if not any(guards(m, tests) for _, tests, _ in rows)]
    assert not orphans, f"mutants whose tests no guarantee names (add the row, or the test to its row): {orphans}"
    unguarded = guarantees.unguarded(ROOT)
    assert len(unguarded) <= UNGUARDED_AT_MOST, (
        f"{len(unguarded)} guarantees have no mutant, more than {UNGUARDED_AT_MOST}: a new promise gets a mutant in "
        f"scripts/mutants.py that its test kills. Without one: {[p[:60] for p in unguarded]}"
    )


def test_a_row_without_a_mutant_says_why() -> None:
    allowed = (guarantees.NONE_YET, *guarantees.EXEMPT)
    bare = [promise[:60] for promise, _, named in guarantees.cells(ROOT) if "`" not in named and named not in allowed]
    assert not bare, f"a mutants cell names mutants in backticks, or is one of {guarantees.EXEMPT}: {bare}"


def test_every_mutant_applies_to_the_line_it_names() -> None:
    # A mechanic rewritten since its mutant was written leaves a mutant that `make mutants` can only call broken:
    # found here, in every `make test`, instead of in the next (long) `make mutants`.
    stale = []
    for mutant in (m for m in mutants.SHIPPED if (ROOT / m.file).is_file()):
        count = (ROOT / mutant.file).read_text().count(mutant.original)
        if count != 1 or mutant.original == mutant.mutated:
            stale.append(f"{mutant.name}: {mutant.file} holds its line {count} times")
    assert not stale, stale
