"""The loss's means: a target that counts for nothing (``IGNORE_INDEX``), and evaluation's exact mean over a whole
split, per sample or per counted token, also across DDP ranks with uneven shards (a mean of batch means, or
``sync_dist`` on a tensor, would not be)."""

from typing import Literal

from torch import Tensor
from torchmetrics import MeanMetric

# A target that counts for nothing (padding): torch's cross_entropy skips it by default, as Hugging Face's labels do.
# A batch is always (inputs, targets): the targets say which positions count, and a net that must know where the
# inputs are padded reads it from the inputs (its pad id), so an exported model keeps one input.
IGNORE_INDEX = -100


class WeightedMean(MeanMetric):
    """torchmetrics' ``MeanMetric`` with its weights kept: with ``nan_strategy="disable"`` (no NaN check, which
    costs a host sync per update) it replaces every weight by 1 (torchmetrics #3434), so a token-weighted mean
    would silently count padding."""

    def __init__(self) -> None:
        super().__init__(nan_strategy="disable")

    def update(self, value: Tensor, weight: Tensor | None = None) -> None:  # type: ignore[override]
        if weight is None:
            super().update(value)
            return
        self.mean_value += (value * weight).sum().to(self.mean_value.dtype)
        self.weight += weight.sum().to(self.weight.dtype)


def summed_over_tokens(losses: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """The sum of the counted tokens' losses, and how many tokens count."""
    counted = targets != IGNORE_INDEX
    return losses.masked_fill(~counted, 0.0).sum(), counted.sum()


Counted = Literal["samples", "tokens"]


def update_mean_loss(metric: MeanMetric, losses: Tensor, targets: Tensor, counted: Counted) -> None:
    """A batch's unreduced losses into ``metric``: each sample's, or each counted token's."""
    if counted == "tokens":
        mask = targets != IGNORE_INDEX
        metric.update(losses.masked_fill(~mask, 0.0), weight=mask.to(losses.dtype))
    else:
        metric.update(losses)
