"""A parsed config's keys as the command line spells them (``model.lr``, ``data.batch_size``): the run table, the
provenance record, the dashboard's hyperparameters and the trackers' params all name a setting this way."""

from typing import Any


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"<prefix>.a.b": 1} (tuples as lists). The ``init_args`` of the task and the DataModule
    are left out of the keys, as the command line spells them: ``model.lr``, ``data.batch_size``."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if name in ("model.init_args", "data.init_args"):
            name = prefix
        if isinstance(value, dict):
            flat.update(flatten(value, name))
        else:
            flat[name] = list(value) if isinstance(value, tuple) else value
    return flat
