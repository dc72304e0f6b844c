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

from project.engine.errors import ConfigError


def call(net: nn.Module, inputs: Any) -> Any:
    """The net on its inputs: several named inputs as keyword arguments, one tensor as the argument."""
    return net(**inputs) if isinstance(inputs, dict) else net(inputs)


def each(inputs: Any, fn: Callable[..., Any]) -> Any:
    """``fn(tensor)`` on every tensor of ``inputs`` (or of any nesting), the structure kept."""
    return apply_to_collection(inputs, Tensor, fn)


def size(inputs: Any) -> int:
    """The number of samples in a batch of inputs (the first dimension of its first tensor)."""
    if isinstance(inputs, Tensor):
        return len(inputs)
    return size(next(iter(inputs.values() if isinstance(inputs, dict) else inputs)))


def first(inputs: Any, count: int) -> Any:
    """The first ``count`` samples of a batch (inputs or targets, any nesting)."""
    return each(inputs, lambda t: t[:count])


def named(shape: Any, dtype: Any) -> dict[str, tuple[tuple[int, ...], torch.dtype]] | None:
    """A DataModule's declared inputs, name: (shape, dtype), for several named inputs; None for one tensor."""
    if not isinstance(shape, dict):
        return None
    return {name: (tuple(s), dtype[name] if isinstance(dtype, dict) else dtype) for name, s in shape.items()}


def describe(value: Any) -> str:
    """A sample's part, in words: what it is and its shape or keys."""
    if isinstance(value, Tensor):
        return f"a tensor shaped {tuple(value.shape)}"
    if isinstance(value, dict):
        return f"a dict with the keys {list(value)}"
    if isinstance(value, list | tuple):
        return f"a {type(value).__name__} of {len(value)} ({', '.join(describe(v) for v in value[:3])})"
    return f"a {type(value).__name__}"


def check_sample(data: Any, sample: Any) -> None:
    """A DataModule's first training sample against its declarations: a ``ConfigError`` in one sentence otherwise."""
    name, inputs = type(data).__name__, sample
    if data.target_kind is not None:
        if not (isinstance(sample, list | tuple) and len(sample) == 2):
            raise ConfigError(
                f"{name} declares target_kind={data.target_kind!r}, so a sample is (inputs, target), but its first "
                f"training sample is {describe(sample)}: return (inputs, target) from the dataset, or set "
                "target_kind = None for data without targets."
            )
        inputs = sample[0]
    named = data.named_inputs
    if named is not None and not (isinstance(inputs, dict) and sorted(inputs) == sorted(named)):
        raise ConfigError(
            f"{name} declares the named inputs {list(named)} (its input_shape), but its first training sample's "
            f"inputs are {describe(inputs)}: return a dict of those names (name: tensor)."
        )
    if named is None and not isinstance(inputs, Tensor):
        raise ConfigError(
            f"{name} declares one input tensor (input_shape={data.input_shape}), but its first training sample's "
            f"inputs are {describe(inputs)}: return the tensor itself (a TensorDataset of inputs alone yields "
            "1-tuples), or for several inputs a dict (name: tensor) with input_shape a dict of the same names."
        )
