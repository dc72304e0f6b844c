"""The README's guarantees table against the tests and the mutants: every test a row names exists, every mutant of
`make mutants` breaks a test some row names (and the row says which mutants those are), and a row without a mutant
is counted, so that a new promise without one is a red test rather than a forgotten one."""

import ast
import re
import sys

from conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import mutants

# Rows whose promise no mutant breaks yet. It may only fall: give a new row a mutant (scripts/mutants.py) that its
# test kills, or give an old one a mutant and lower this.
UNGUARDED_AT_MOST = 47
NONE_YET = "none yet"

Ref = tuple[str, str | None]  # (test file, test function or None for the whole file)


def guarantee_rows() -> list[tuple[str, set[Ref], list[str]]]:
    """Each row of the guarantees table: (the promise, the tests it names, the mutants it names)."""
    readme = (ROOT / "README.md").read_text()
    start = readme.index("## What the template guarantees")
    section = readme[start : readme.index("\n## ", start + 5)]
    rows, previous = [], set()
    for line in section.splitlines():
        if not line.startswith("| ") or line.startswith("| guarantee "):
            continue
        promise, tests, named = (cell.strip() for cell in line.strip("| ").rsplit(" | ", 2))
        previous = refs_in_cell(tests, previous)
        rows.append((promise, previous, [] if named == NONE_YET else re.findall(r"`([\w-]+)`", named)))
    return rows


def refs_in_cell(cell: str, previous: set[Ref]) -> set[Ref]:
    """The tests a row's test cell names: ``test_x.py``, ``test_x.py::name[param]``, ``...::name`` (the file named
    before it in the cell), and "same test" (the row above's)."""
    found = set(previous) if cell.startswith("same test") else set()
    file = None
    for token in re.findall(r"`([^`]+)`", cell):
        if match := re.fullmatch(r"(test_\w+\.py)(?:::(\w+))?(?:\[.*\])?", token):
            file = match.group(1)
            found.add((file, match.group(2)))
        elif (match := re.fullmatch(r"\.\.\.::(\w+)(?:\[.*\])?", token)) and file:
            found.add((file, match.group(1)))
    return found


def refs_of_mutant(mutant: mutants.Mutant) -> set[Ref]:
    refs: set[Ref] = set()
    for test in mutant.tests:
        file, _, function = test.removeprefix("tests/").partition("::")
        refs.add((file, function.split("[")[0] or None))
    return refs


def guards(mutant: mutants.Mutant, row_tests: set[Ref]) -> bool:
    """The mutant runs a test the row names (the same function, or one of the file the row names whole)."""
    return any(
        file == theirs and (function is None or other is None or function == other)
        for file, function in row_tests
        for theirs, other in refs_of_mutant(mutant)
    )


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
    unguarded = [promise for promise, _, named in rows if not named]
    assert len(unguarded) <= UNGUARDED_AT_MOST, (
        f"{len(unguarded)} guarantees have no mutant, more than {UNGUARDED_AT_MOST}: a new promise gets a mutant in "
        f"scripts/mutants.py that its test kills. Without one: {[p[:60] for p in unguarded]}"
    )
