"""A run is portable: what a DataModule learned from the training data that reading new inputs needs (the attributes
its ``learned`` names: the class names, the shapes, a table's columns, a tokenizer) is kept in the checkpoint as plain
data, with the first ``EXAMPLES`` test inputs and their targets (export's parity check; the inspect notebook where the
data is not). ``predict`` on files and ``export`` rebuild the DataModule from them inside ``restoring``: its
``restored()`` is then true and its ``__init__`` reads nothing of the training data, so a run directory copied to a
machine without that data still predicts and exports the same.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

# The first this many test inputs travel in the checkpoint: export checks its parity on them, data or no data.
EXAMPLES = 32

# The learned attributes of the DataModule being rebuilt from a checkpoint (``restoring``); None otherwise.
_RESTORING: ContextVar[dict[str, Any] | None] = ContextVar("restoring", default=None)


@contextmanager
def restoring(learned: dict[str, Any] | None) -> Iterator[None]:
    """DataModules built inside take their ``learned`` attributes from ``learned`` (a checkpoint's) instead of the
    training data; with None, nothing changes."""
    token = _RESTORING.set(learned)
    try:
        yield
    finally:
        _RESTORING.reset(token)


def being_restored() -> dict[str, Any] | None:
    """The learned attributes a DataModule built now takes (inside ``restoring``), else None."""
    return _RESTORING.get()


def learned_in(checkpoint: dict[str, Any]) -> dict[str, Any] | None:
    """The learned attributes a checkpoint keeps for its DataModule (None for a run trained before they were)."""
    class_path = (checkpoint.get("datamodule_hyper_parameters") or {}).get("_class_path", "")
    state = checkpoint.get(class_path.rpartition(".")[2]) or {}  # Lightning keys it by the class's __qualname__
    return state.get("learned") if isinstance(state, dict) else None


def state_of(datamodule: Any, train_loader: Any) -> dict[str, Any]:
    """The DataModule's checkpoint state: its statistics, its learned attributes, its examples, and the train loader's
    position in the epoch (Lightning skips its own restore of a loader built early, as
    ``estimated_stepping_batches`` builds it: the position travels here, restored before any loader is built)."""
    examples, targets = datamodule.examples()
    state: dict[str, Any] = {
        "normalization": datamodule.normalization,
        "learned": {name: getattr(datamodule, name) for name in datamodule.learned},
        "examples": examples,
        "example_targets": targets,
    }
    if train_loader is not None:
        state["train_loader"] = train_loader.state_dict()
    return state


def load_state(datamodule: Any, state: dict[str, Any]) -> None:
    """``state_of``'s state back: the loader's position (taken by the next train loader), statistics, examples."""
    datamodule._train_loader_state = state.get("train_loader")
    if state.get("normalization") is not None:
        datamodule._normalization, datamodule._norm_tensors = state["normalization"], {}
    if state.get("examples") is not None:
        datamodule._examples = state["examples"], state.get("example_targets")


def restore_learned(datamodule: Any, learned: dict[str, Any] | None) -> bool:
    """Sets ``datamodule``'s learned attributes from ``learned`` (a checkpoint's); False, changing nothing, without."""
    for name, value in (learned or {}).items():
        setattr(datamodule, name, value)
    return learned is not None
