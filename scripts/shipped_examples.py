"""The shipped examples, each a unit you may keep or delete: its files (the task, DataModule or net, its configs,
its tests and the test overlays that select it) and the examples it builds on. ``make new-project KEEP=...``
copies only the examples kept; deleting an example's files by hand is the same. What reads this list skips an
example whose files are not all there: the contract suite's subjects, ``make mutants``, ``make bench``'s
workloads. Everything not listed is the engine, the engine tests (on tests/toy.py and tests/tokens.py) and what
every repository keeps: the digits, the Classifier and project/nets.py (the offline default run that ``make
train``, the notebooks, the bench and scripts/gpu_check.sh start from).

The manual (README.md and docs/*.md: scripts/manual.py) marks the text of an example between
``<!-- example: NAME -->`` and ``<!-- /example: NAME -->``, on whichever page it stands.
Only the standard library: scripts/new_project.py reads it before any install.
"""

import re
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]


class Example(NamedTuple):
    files: tuple[str, ...]
    needs: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()  # "tasks.regression": a module the package's __init__ imports


EXAMPLES = {
    "table": Example(
        ("project/data/table.py", "configs/data/csv.yaml", "tests/configs/table.yaml", "tests/test_table.py"),
        modules=("data.table",),
    ),
    "regression": Example(
        (
            "project/tasks/regression.py",
            "configs/tasks/regression.yaml",
            "tests/configs/regression.yaml",
            "tests/test_regression.py",
        ),
        needs=("table",),
        modules=("tasks.regression",),
    ),
    "multilabel": Example(
        (
            "project/tasks/multilabel.py",
            "configs/tasks/multilabel.yaml",
            "tests/configs/multilabel.yaml",
            "tests/test_multilabel.py",
        ),
        needs=("table",),
    ),
    "images": Example(
        ("project/data/images.py", "configs/data/images.yaml", "tests/configs/images.yaml", "tests/test_images.py"),
        modules=("data.images",),
    ),
    "segmentation": Example(
        (
            "project/tasks/segmentation.py",
            "project/data/segmentation.py",
            "configs/tasks/segmentation.yaml",
            "tests/configs/segmentation.yaml",
            "tests/test_segmentation.py",
        ),
        needs=("images",),
        modules=("tasks.segmentation", "data.segmentation"),
    ),
    "moons": Example(("project/data/moons.py", "tests/test_moons.py")),
    "language_model": Example(
        (
            "project/tasks/language_model.py",
            "project/data/text.py",
            "project/data/tokenizer.py",
            "project/gpt.py",
            "configs/tasks/language_model.yaml",
            "configs/sweeps/language_model.yaml",
            "tests/configs/language_model.yaml",
            "tests/test_language_model.py",
        ),
        modules=("tasks.language_model", "data.text", "data.tokenizer"),
    ),
    "text_classification": Example(
        (
            "project/data/labelled_text.py",
            "project/text_encoder.py",
            "configs/tasks/text_classification.yaml",
            "tests/configs/text_classification.yaml",
        ),
        needs=("language_model",),
        modules=("data.labelled_text",),
    ),
    "timm": Example(
        (
            "project/backbones.py",
            "configs/nets/timm.yaml",
            "configs/nets/finetune.yaml",
            "configs/sweeps/finetune.yaml",
            "tests/test_timm.py",
        ),
        needs=("images",),  # its tests and configs fine-tune on an image folder
    ),
}


def present(name: str, root: Path = ROOT) -> bool:
    """Whether every file of the example (and of those it builds on) is in the repository at ``root``."""
    example = EXAMPLES[name]
    return all((root / f).is_file() for f in example.files) and all(present(n, root) for n in example.needs)


def with_needs(names: list[str]) -> list[str]:
    """``names`` and every example they build on, in this list's order."""
    wanted: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name not in wanted:
            wanted.add(name)
            todo.extend(EXAMPLES[name].needs)
    return [n for n in EXAMPLES if n in wanted]


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
