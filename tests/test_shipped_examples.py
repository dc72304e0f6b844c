"""The shipped examples are removable units (scripts/shipped_examples.py): an example is all there or not at all,
its code imports only the examples it declares it builds on, and nothing outside an example names it, so deleting
one (by hand or by leaving it out of `make new-project KEEP=...`) never breaks a test of the engine."""

import re
from pathlib import Path

import pytest
from conftest import PACKAGE, ROOT
from shipped_examples import EXAMPLES, names, present

# The template's examples as they ship: `make check-manual` (the template's CI) runs these, `make test` does not.
pytestmark = [
    pytest.mark.manual,
    pytest.mark.guarantee(
        "the shipped examples are removable units: an example is all there or not at all, its code imports only "
        "the examples it builds on, and no test, config or engine file outside it names it"
    ),
]


def _own_files(example: str) -> set[str]:
    """The example's files and those of every example that builds on it (which may name it)."""
    users = {n for n in EXAMPLES if example in EXAMPLES[n].needs}
    return set(EXAMPLES[example].files).union(*(_own_files(u) for u in users))


def test_an_example_is_all_there_or_not_at_all() -> None:
    for name, example in EXAMPLES.items():
        here = [f for f in example.files if (ROOT / f).is_file()]
        assert here in ([], list(example.files)), f"{name}: only {here} of {list(example.files)} are here"


def test_an_examples_code_imports_only_the_examples_it_builds_on() -> None:
    for name in filter(present, EXAMPLES):
        allowed = {name, *EXAMPLES[name].needs}
        for file in EXAMPLES[name].files:
            if not (file.startswith(f"{PACKAGE}/") and file.endswith(".py")):
                continue
            text = (ROOT / file).read_text()
            for other in set(filter(present, EXAMPLES)) - allowed:
                named = [m for m in names(other) if re.search(rf"\b{re.escape(m)}\b", text)]
                assert not named, f"{file} ({name}) imports {named} of {other}: add it to {name}'s needs"


def test_nothing_outside_an_example_names_its_code_or_its_configs() -> None:
    # Every test, test fixture and config, and the engine: what deleting an example would break. Not
    # configs/default.yaml: it is your choice of task and data, any example's (the contract suite runs it).
    places = (("tests", "*.py"), ("tests", "*.yaml"), ("configs", "*.yaml"), (f"{PACKAGE}/engine", "*.py"))
    outside = [path for folder, pattern in places for path in (ROOT / folder).rglob(pattern)
               if path != ROOT / "configs" / "default.yaml"]  # fmt: skip
    for name in filter(present, EXAMPLES):
        own = _own_files(name)
        named_by = names(name) | {f for f in EXAMPLES[name].files if f.endswith(".yaml")}
        for path in outside:
            relative = str(path.relative_to(ROOT))
            if relative in own or path == Path(__file__):
                continue
            text = path.read_text()
            named = sorted(n for n in named_by if re.search(rf"(?<![\w/.]){re.escape(n)}(?![\w.])", text))
            assert not named, f"{relative} names {named} of the {name} example: deleting it would break this file"
