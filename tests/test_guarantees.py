"""The guarantees (``@pytest.mark.guarantee`` on the tests that prove them; scripts/guarantees.py lists them) against
the mutants of ``make mutants`` (scripts/mutants.py): every mutant runs tests that exist and breaks a marked promise,
and every promise has a mutant or says why none can break it, so a new promise without one is a red test rather
than a forgotten one."""

import guarantees  # scripts/ (conftest puts it on the path)
import mutants
import pytest
from conftest import ROOT

# The template's own bookkeeping: `make check-manual` (the template's CI) runs these, `make test` does not.
pytestmark = pytest.mark.manual

WHY_NONE = ("Lightning's own", "CUDA only", "an example's own code")  # scripts/guarantees.py says what each means


def test_every_test_a_mutant_runs_exists() -> None:
    missing = []
    for mutant in mutants.MUTANTS:
        for file, function in guarantees.refs_of_tests(mutant.tests):
            path = ROOT / "tests" / file
            if not path.is_file() or (function is not None and function not in guarantees.test_functions(path)):
                missing.append(f"{mutant.name}: {file}::{function}")
    assert not missing, f"mutants run tests that do not exist: {missing}"


def test_every_mutant_breaks_a_marked_promise_and_every_promise_has_a_mutant_or_says_why_not() -> None:
    promises = guarantees.guarantees(ROOT)
    assert promises, "no test carries @pytest.mark.guarantee"
    orphans = [m.name for m in mutants.MUTANTS if not any(guarantees.guards(m.tests, g.tests) for g in promises)]
    assert not orphans, f"mutants whose tests carry no guarantee marker (mark the test with its promise): {orphans}"
    for g in promises:
        guarded = any(guarantees.guards(m.tests, g.tests) for m in mutants.MUTANTS)
        if g.unmutated is None:
            assert guarded, f"no mutant breaks this promise: give it one in scripts/mutants.py ({g.promise[:80]})"
        else:
            assert g.unmutated in WHY_NONE, f"unmutated={g.unmutated!r}: one of {WHY_NONE} ({g.promise[:80]})"


def test_every_mutant_applies_to_the_line_it_names() -> None:
    # A mechanic rewritten since its mutant was written leaves a mutant that `make mutants` can only call broken:
    # found here instead of in the next (long) `make mutants`.
    stale = []
    for mutant in (m for m in mutants.SHIPPED if (ROOT / m.file).is_file()):
        count = (ROOT / mutant.file).read_text().count(mutant.original)
        if count != 1 or mutant.original == mutant.mutated:
            stale.append(f"{mutant.name}: {mutant.file} holds its line {count} times")
    assert not stale, stale
