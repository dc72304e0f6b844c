"""What an optimizer step's gradient is, however many micro-batches and processes make it: ``Task.backward`` applies
one of these two factors to the loss before it is back-propagated.

Lightning divides each micro-batch's loss by ``accumulate_grad_batches`` (k) and DDP averages the gradients of the W
processes. For a loss per sample that is the big batch's mean, except in an epoch's last window of r < k micro-batches
(``tail_window_correction``). For a loss per token the step must be the sum of its per-token losses divided by its
count of counted tokens, over every micro-batch and process (``token_weighting``; Lightning #20350).
"""

import math

import lightning as L
import torch
from torch import Tensor, nn


def is_last_micro_batch(trainer: L.Trainer) -> bool:
    """Whether the micro-batch under way ends its optimizer step's window."""
    # Private: Lightning has no public way to ask whether this micro-batch ends its window; its own rule is this
    # (Lightning #19987, #21808). The accumulation and token tests fail if it changes.
    return not trainer.fit_loop.epoch_loop._should_accumulate()


def token_weighting(trainer: L.Trainer, module: nn.Module, window_tokens: Tensor) -> Tensor:
    """At the last micro-batch of an optimizer step, the factor that turns the step's gradient into that of the sum of
    its per-token losses divided by its count of counted tokens (``window_tokens``: this process's), over every
    micro-batch and process: k * W / tokens. The gradients accumulated so far are scaled here, and the last
    micro-batch's loss by the caller, before DDP's reduction and before any ``on_before_optimizer_step`` hook
    (clipping, the grad-norm log, callbacks) sees them."""
    tokens = trainer.strategy.reduce(window_tokens, reduce_op="sum")  # one collective per step
    scale = trainer.accumulate_grad_batches * trainer.world_size / tokens.clamp_min(1).double()
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    if grads:  # Private: torch's multi-tensor op, public only as torch.foreach (pytorch #58833, #193607).
        torch._foreach_mul_(grads, scale.to(grads[0].dtype))
    return scale


def tail_window_correction(trainer: L.Trainer) -> float:
    """An epoch's last window of r < k micro-batches would give its step r/k of its gradient (Lightning #19987):
    scaling those losses by k/r makes that step the mean over its r micro-batches, as a big batch."""
    k = trainer.accumulate_grad_batches
    n = trainer.num_training_batches
    if k == 1 or not math.isfinite(n):
        return 1.0
    batch_idx = trainer.fit_loop.epoch_loop.batch_idx
    window = min(k, int(n) - batch_idx // k * k)
    return k / window


def is_logging_step(trainer: L.Trainer) -> bool:
    """Whether the optimizer step under way is one the logger writes (``global_step + 1`` is its number, as
    Lightning's ``should_update_logs`` counts before the step)."""
    every = trainer.log_every_n_steps  # type: ignore[attr-defined]
    return every > 0 and (trainer.global_step + 1) % every == 0
