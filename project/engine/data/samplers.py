"""The samplers every DataModule uses. Training: a seeded ``DistributedSampler`` and a DataLoader whose position inside
an epoch is saved in checkpoints, so a run resumed mid-epoch continues with exactly the batches it would have seen
next (Lightning saves and restores any train loader that has ``state_dict``/``load_state_dict``, Lightning #19764; a
plain DataLoader restarts the epoch from its first batch). Evaluation: every sample exactly once, unpadded.
"""

import itertools
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class ResumableSampler(DistributedSampler):
    """torch's seeded ``DistributedSampler`` (shuffled, its tail dropped) that can start its next epoch part-way
    through (``skip_next``). Its order is torch's, drawn as a tensor and handed out in chunks: torch's list of Python
    ints costs ~40 bytes a sample (a language model's 10 GB corpus: 156 M blocks of 64 bytes, 6 GB), this 8."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        assert self.shuffle and self.drop_last, "the training sampler shuffles and drops the uneven tail"
        self._skip = 0

    def skip_next(self, n: int) -> None:
        """Drop the first ``n`` samples of the next iteration only (their order is that of the current epoch)."""
        self._skip = n

    def __iter__(self) -> Iterator[int]:
        skip, self._skip = self._skip, 0
        order = torch.randperm(len(self.dataset), generator=torch.Generator().manual_seed(self.seed + self.epoch))  # type: ignore[arg-type]
        mine = order[: self.total_size][self.rank :: self.num_replicas][skip:]  # DistributedSampler's, as a view
        return itertools.chain.from_iterable(chunk.tolist() for chunk in mine.split(1 << 16))


class ResumableDataLoader(DataLoader):
    """DataLoader over a ``ResumableSampler`` that counts the batches it has handed out in the current epoch.

    The state is (epoch, batches consumed): counted where training consumes batches, so it is right with any
    number of workers, whatever they prefetched. ``len()`` stays the full epoch, as Lightning expects.
    ``wait_seconds`` adds up the time spent waiting for batches (read by the ``TrainingMonitor``).
    """

    sampler: ResumableSampler

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._consumed = 0
        self._resume: dict[str, int] | None = None
        self.wait_seconds = 0.0

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        # A generator: nothing below runs until the first batch is requested, which Lightning does after it has
        # called set_epoch (on a resume it restores our state, then calls iter(), then set_epoch).
        resume, self._resume = self._resume, None
        epoch = getattr(self.sampler, "epoch", 0)
        skip = resume["batches"] if resume is not None and resume["epoch"] == epoch else 0
        assert self.batch_size is not None
        # Lightning swaps in its own sampler for some flags (overfit_batches: a SequentialSampler); those cannot
        # skip, so the batches already trained on are drawn and dropped instead.
        can_skip = isinstance(self.sampler, ResumableSampler)
        if can_skip:
            self.sampler.skip_next(skip * self.batch_size)
        # Worker seeds come from this generator, re-seeded per epoch from the sampler's seed: never from the global
        # RNG, whose state (dropout) is checkpointed separately and must not depend on when an iterator was made.
        assert self.generator is not None
        self.generator.manual_seed(getattr(self.sampler, "seed", 0) + epoch)
        self._consumed = skip
        batches: Iterator[Any] = super().__iter__()
        if not can_skip:
            batches = itertools.islice(batches, skip, None)
        while True:
            start = time.perf_counter()
            try:
                batch = next(batches)
            except StopIteration:
                return
            self.wait_seconds += time.perf_counter() - start
            self._consumed += 1
            yield batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": getattr(self.sampler, "epoch", 0), "batches": self._consumed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._resume = dict(state)
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(state["epoch"])


class UnpaddedDistributedSampler(DistributedSampler):
    """Evaluation sampler giving rank r the samples r, r+W, r+2W, ...: every sample is seen exactly once.

    torch's DistributedSampler pads the index list with repeats so every rank gets the same count, and
    torchmetrics does not remove them, so DDP val/test metrics would be biased. Uneven
    shards are safe here because evaluation makes no per-step collective call (metrics sync once, at epoch end).
    """

    def __init__(self, dataset: Dataset, num_replicas: int, rank: int) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=False)
        self.num_samples = len(range(rank, len(self.dataset), num_replicas))  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, len(self.dataset), self.num_replicas))  # type: ignore[arg-type]
