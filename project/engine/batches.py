"""A batch is whatever the DataModule yields; these are the few things the engine does with one, without indexing it.

The inputs of a sample are one tensor, or several named ones (a dict, name: tensor; the net is called with them as
keyword arguments, and export gives each its own named input). A sample is (inputs, targets), or the inputs alone for
data without targets (``target_kind = None``). The task says how its batch splits (``Task.split_batch``).
"""

from collections.abc import Callable
from typing import Any

import torch
from lightning_utilities.core.apply_func import apply_to_collection
from torch import Tensor, nn

Inputs = Tensor | dict[str, Tensor]


def call(net: nn.Module, inputs: Any) -> Any:
    """The net on its inputs: several named inputs as keyword arguments, one tensor as the argument."""
    return net(**inputs) if isinstance(inputs, dict) else net(inputs)


def each(inputs: Any, fn: Callable[..., Any]) -> Any:
    """``fn(tensor)`` on every tensor of ``inputs`` (or of any nesting), the structure kept."""
    return apply_to_collection(inputs, Tensor, fn)


def size(inputs: Any) -> int:
    """The number of samples in a batch of inputs (the first dimension of its first tensor)."""
    first = inputs if isinstance(inputs, Tensor) else next(iter(inputs.values() if isinstance(inputs, dict) else inputs))
    return len(first) if isinstance(first, Tensor) else size(first)


def first(inputs: Any, count: int) -> Any:
    """The first ``count`` samples of a batch (inputs or targets, any nesting)."""
    return each(inputs, lambda t: t[:count])


def named(shape: Any, dtype: Any) -> dict[str, tuple[tuple[int, ...], torch.dtype]] | None:
    """A DataModule's declared inputs, name: (shape, dtype), for several named inputs; None for one tensor."""
    if not isinstance(shape, dict):
        return None
    return {name: (tuple(s), dtype[name] if isinstance(dtype, dict) else dtype) for name, s in shape.items()}
