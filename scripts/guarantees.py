"""The template's guarantees, read from the tests that prove them: each ``@pytest.mark.guarantee("promise")`` on a
test (or in a test file's ``pytestmark``: every test of the file), with the mutants of ``make mutants`` that break
it (scripts/mutants.py: each names the tests that must fail). ``unmutated="..."`` says why no mutant can break a
promise: "Lightning's own" (no line here keeps it; the test guards against a change that would break it), "CUDA
only" (its test needs a GPU), "an example's own code" (the shipped example's lines are yours to change).

    python scripts/guarantees.py     # the table: promise | tests | mutants

Read statically (no test is imported): tests/test_guarantees.py holds it to scripts/mutants.py. Only the standard
library."""

import ast
import sys
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]

Ref = tuple[str, str | None]  # (test file, test function or None for the whole file)


class Guarantee(NamedTuple):
    promise: str
    unmutated: str | None
    tests: frozenset[Ref]


def _marks(node: ast.expr) -> list[tuple[str, str | None]]:
    """The guarantee markers in a decorator or a ``pytestmark`` value: (promise, unmutated)."""
    found = []
    for call in ast.walk(node):
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "guarantee":
            why = next((ast.literal_eval(k.value) for k in call.keywords if k.arg == "unmutated"), None)
            found.append((ast.literal_eval(call.args[0]), why))
    return found


def test_functions(path: Path) -> set[str]:
    return {n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)}


def guarantees(root: Path = ROOT) -> list[Guarantee]:
    """Every promise the tests under ``root/tests`` mark, in file order, with the tests marked for it."""
    tests: dict[tuple[str, str | None], set[Ref]] = {}
    for path in sorted((root / "tests").glob("test_*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in node.targets):
                marked = [(mark, None) for mark in _marks(node.value)]
            elif isinstance(node, ast.FunctionDef):
                marked = [(mark, node.name) for d in node.decorator_list for mark in _marks(d)]
            else:
                continue
            for mark, function in marked:
                tests.setdefault(mark, set()).add((path.name, function))
    return [Guarantee(promise, why, frozenset(refs)) for (promise, why), refs in tests.items()]


def refs_of_tests(tests: tuple[str, ...]) -> set[Ref]:
    refs: set[Ref] = set()
    for test in tests:
        file, _, function = test.removeprefix("tests/").partition("::")
        refs.add((file, function.split("[")[0] or None))
    return refs


def guards(mutant_tests: tuple[str, ...], promise_tests: frozenset[Ref]) -> bool:
    """A mutant whose tests are ``mutant_tests`` runs a test marked for the promise (the same function, or one of a
    file marked whole, or any marked test of a file the mutant runs whole)."""
    return any(
        file == theirs and (function is None or other is None or function == other)
        for file, function in promise_tests
        for theirs, other in refs_of_tests(mutant_tests)
    )


def table(root: Path = ROOT) -> str:
    sys.path.insert(0, str(root / "scripts"))
    import mutants

    lines = ["| guarantee | tests | mutants (`make mutants`) |", "|---|---|---|"]
    for g in guarantees(root):
        tests = ", ".join(f"`{file}::{function}`" if function else f"`{file}`" for file, function in sorted(g.tests))
        named = [f"`{m.name}`" for m in mutants.MUTANTS if guards(m.tests, g.tests)]
        lines.append(f"| {g.promise} | {tests} | {', '.join(named) or f'none: {g.unmutated}'} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
