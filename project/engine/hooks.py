"""Callbacks that cost nothing on the batches they do nothing on.

Lightning calls every per-batch hook of every callback on every batch, ~11 Python calls each (its profiler's context
manager, the callback's ``state_key``, the hook), even when the hook is ``Callback``'s empty default: with a dozen
callbacks that is ~800 calls per training step, as many as Lightning's whole loop. Lightning skips a hook that is not
callable (``if callable(fn)`` in ``_call_callback_hooks``, lightning/pytorch/trainer/call.py; calling only the
overridden hooks was proposed in Lightning #10575 and left), so ``defined_hooks_only`` sets each per-batch hook a
class inherits unchanged from ``Callback`` to None. ``test_host_work.py`` fails the day Lightning calls them anyway.
"""

from typing import TypeVar

from lightning.pytorch.callbacks import Callback

PER_BATCH_HOOKS = (
    "on_train_batch_start",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_before_zero_grad",
    "on_train_batch_end",
    "on_validation_batch_start",
    "on_validation_batch_end",
    "on_test_batch_start",
    "on_test_batch_end",
    "on_predict_batch_start",
    "on_predict_batch_end",
)

C = TypeVar("C", bound=type[Callback])


def defined_hooks_only(cls: C) -> C:
    """Class decorator: Lightning calls only the per-batch hooks ``cls`` (or a parent other than ``Callback``)
    defines. A subclass that defines one of the others is called as usual (it must not call ``super()``'s: None)."""
    for name in PER_BATCH_HOOKS:
        if getattr(cls, name) is getattr(Callback, name):
            setattr(cls, name, None)
    return cls
