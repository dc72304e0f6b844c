"""The shipped examples, each a unit you may keep or delete, listed in shipped_examples.json beside this file: its
files (the task, DataModule or net, its configs, its tests and the test overlays that select it) and the examples it
builds on (timm needs images: its tests and configs fine-tune on an image folder). The template's copier.yml reads
the same list to leave out the examples a new repository does not keep; deleting an example's files by hand is the
same. What reads this list skips an example whose files are not all there: the contract suite's subjects and
``make bench``'s workloads. Everything not listed is the engine, the engine tests (on tests/toy.py and
tests/tokens.py) and what every repository keeps: the digits, the Classifier and project/nets.py.

The manual (README.md and docs/*.md: scripts/manual.py) marks the text of an example between
``<!-- example: NAME -->`` and ``<!-- /example: NAME -->``, on whichever page it stands. Only the standard library.
"""

import json
import re
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]


class Example(NamedTuple):
    files: tuple[str, ...]
    needs: tuple[str, ...] = ()
    extras: tuple[str, ...] = ()  # pyproject's optional dependencies only this example uses


_LISTED = json.loads((Path(__file__).with_suffix(".json")).read_text())
EXAMPLES = {name: Example(*(tuple(e.get(k, ())) for k in Example._fields)) for name, e in _LISTED.items()}


def present(name: str, root: Path = ROOT) -> bool:
    """Whether every file of the example (and of those it builds on) is in the repository at ``root``."""
    example = EXAMPLES[name]
    return all((root / f).is_file() for f in example.files) and all(present(n, root) for n in example.needs)


def with_needs(keep: list[str]) -> set[str]:
    """The examples ``keep`` names and those they build on (as copier.yml's ``keep`` brings them)."""
    kept = set(keep)
    while more := {n for k in kept for n in EXAMPLES[k].needs} - kept:
        kept |= more
    return kept


def names(example: str, root: Path = ROOT) -> set[str]:
    """How code and configs name an example: the dotted modules of its Python files in the package, and its classes
    as the package exports them (``project.tasks.Regressor``)."""
    found = set()
    for file in EXAMPLES[example].files:
        if file.endswith(".py") and not file.startswith(("tests/", "scripts/", "benchmarks/")):
            dotted = file.removesuffix(".py").replace("/", ".")
            parent = dotted.rpartition(".")[0]
            found |= {dotted, *(f"{parent}.{c}" for c in re.findall(r"(?m)^class (\w+)", (root / file).read_text()))}
    return found


def selected_by(config: str, root: Path = ROOT) -> list[str]:
    """The examples (of those at ``root``) that a config's text names, e.g. in its class paths."""
    return [n for n in EXAMPLES if present(n, root)
            and any(re.search(rf"(?<![\w.]){re.escape(m)}(?![\w.])", config) for m in names(n, root))]  # fmt: skip
