"""The loss's means: a target that counts for nothing (``IGNORE_INDEX``), and evaluation's exact mean over what it
read, per sample or per counted token, also across DDP ranks with uneven shards (a mean of batch means, or
``sync_dist`` on a tensor, would not be), with its standard error."""

from typing import Literal

import torch
from torch import Tensor
from torchmetrics import Metric

# A target that counts for nothing (padding): torch's cross_entropy skips it by default, as Hugging Face's labels do.
# A batch is always (inputs, targets): the targets say which positions count, and a net that must know where the
# inputs are padded reads it from the inputs (its pad id), so an exported model keeps one input.
IGNORE_INDEX = -100


class EvaluatedLoss(Metric):
    """An evaluation's loss: the exact mean over every sample evaluated (of its losses, or of its counted tokens'),
    whatever the batches and processes (its sums are summed across them), and that mean's standard error with the
    sample as the unit: from the per-sample sums s_i and counts w_i, a ratio estimate L = sum(s) / sum(w) with
    se^2 = n / (n - 1) * sum((s_i - L w_i)^2) / sum(w)^2 (the sample standard deviation over sqrt(n) when every w_i
    is the same). ``compute()`` returns L and sets ``standard_error``."""

    full_state_update = False
    total: Tensor
    weight: Tensor
    total_sq: Tensor
    cross: Tensor
    weight_sq: Tensor
    count: Tensor

    def __init__(self) -> None:
        super().__init__()
        for name in ("total", "weight", "total_sq", "cross", "weight_sq", "count"):
            self.add_state(name, torch.zeros(()), dist_reduce_fx="sum")  # the default dtype, as torchmetrics' means
        self.standard_error = torch.tensor(float("nan"))

    def update(self, sums: Tensor, counts: Tensor) -> None:
        """Each sample's summed loss and how many values it sums (1, its pixels, or its counted tokens)."""
        sums, counts = sums.to(self.total.dtype), counts.to(self.total.dtype)
        self.total += sums.sum()
        self.weight += counts.sum()
        self.total_sq += (sums * sums).sum()
        self.cross += (sums * counts).sum()
        self.weight_sq += (counts * counts).sum()
        self.count += sums.numel()

    def compute(self) -> Tensor:
        mean = self.total / self.weight
        residual = (self.total_sq - 2 * mean * self.cross + mean * mean * self.weight_sq).clamp_min(0)
        n = self.count
        self.standard_error = ((n / (n - 1)) * residual).sqrt() / self.weight if n > 1 else mean.new_tensor(torch.nan)
        return mean


def summed_over_tokens(losses: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """The sum of the counted tokens' losses, and how many tokens count."""
    counted = targets != IGNORE_INDEX
    return losses.masked_fill(~counted, 0.0).sum(), counted.sum()


Counted = Literal["samples", "tokens"]


def update_mean_loss(metric: EvaluatedLoss, losses: Tensor, targets: Tensor, counted: Counted) -> None:
    """A batch's unreduced losses into ``metric``, per sample: the sum of its losses (of its pixels, or of its
    counted tokens) and how many there are."""
    per_sample = losses.reshape(len(losses), -1)
    if counted == "tokens":
        mask = (targets != IGNORE_INDEX).reshape(len(losses), -1)
        metric.update(per_sample.masked_fill(~mask, 0.0).sum(1), mask.sum(1))
    else:
        metric.update(per_sample.sum(1), torch.full_like(per_sample[:, 0], per_sample.shape[1]))
