"""The manual's guarantees table (on whichever page of README.md and docs/ holds it), read: each row's promise, the
tests it names and the mutants it names; which mutants guard a row. tests/test_guarantees.py holds the table to
scripts/mutants.py with it, and scripts/new_project.py rewrites the rows of a repository that keeps only some
examples. Only the standard library."""

import re
from pathlib import Path

import manual

SECTION = "What the template guarantees"
NONE_YET = "none yet"
# A row that no mutant of this repository can break, and why: no line of it keeps the promise (Lightning does; the
# test guards against a change here that would break it), or the row's test runs on a CUDA device only.
EXEMPT = ("none: Lightning's own", "none: CUDA only")

Ref = tuple[str, str | None]  # (test file, test function or None for the whole file)


def split_row(line: str) -> tuple[str, str, str] | None:
    """A table line -> (promise, tests cell, mutants cell); None for the header, the rule and non-table lines."""
    if not line.startswith("| ") or line.startswith("| guarantee "):
        return None
    promise, tests, named = (cell.strip() for cell in line.strip().strip("|").strip().rsplit(" | ", 2))
    return promise, tests, named


def section_bounds(page: str) -> tuple[int, int] | None:
    """Where the table's section runs in a page of the manual; None on the pages without it."""
    return manual.section_bounds(page, SECTION)


def cells(root: Path) -> list[tuple[str, str, str]]:
    """Each row of the guarantees table of the manual at ``root``, as written: (promise, tests cell, mutants cell)."""
    _, section = manual.section(root, SECTION)
    return [row for line in section.splitlines() if (row := split_row(line)) is not None]


def guarantee_rows(root: Path) -> list[tuple[str, set[Ref], list[str]]]:
    """Each row of the guarantees table of the manual at ``root``: (the promise, the tests it names, the mutants
    it names)."""
    rows, previous = [], set()
    for promise, tests, named in cells(root):
        previous = refs_in_cell(tests, previous)
        rows.append((promise, previous, re.findall(r"`([\w-]+)`", named)))
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


def unguarded(root: Path) -> list[str]:
    """The promises whose mutants cell says "none yet": a mutant is owed (the exempt ones say why none can be)."""
    return [promise for promise, _, named in cells(root) if named == NONE_YET]


def refs_of_tests(tests: tuple[str, ...]) -> set[Ref]:
    refs: set[Ref] = set()
    for test in tests:
        file, _, function = test.removeprefix("tests/").partition("::")
        refs.add((file, function.split("[")[0] or None))
    return refs


def guards(mutant_tests: tuple[str, ...], row_tests: set[Ref]) -> bool:
    """A mutant whose tests are ``mutant_tests`` runs a test the row names (the same function, or one of the file
    the row names whole)."""
    return any(
        file == theirs and (function is None or other is None or function == other)
        for file, function in row_tests
        for theirs, other in refs_of_tests(mutant_tests)
    )
