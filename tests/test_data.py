"""The DataModule: a fixed, disjoint split of the bundled digits, and samplers that shard exactly."""

import os

import pytest
import torch
from sklearn.datasets import load_digits
from torch.utils.data import DistributedSampler
from toy import Digits

from project.engine.data.samplers import ResumableSampler, UnpaddedDistributedSampler


def _datamodule(**kwargs: object) -> Digits:
    dm = Digits(**kwargs)  # type: ignore[arg-type]
    dm.setup("fit")
    return dm


@pytest.mark.guarantee(
    "the split is disjoint, complete and fixed by its own seed; the training order depends only on the run's seed "
    "and the epoch; every loader setting comes from the DataModule"
)
def test_split_is_disjoint_complete_and_fixed_by_its_own_seed() -> None:
    dm = _datamodule()
    sets = [dm.split_tensors(split) for split in ("train", "val", "test")]
    assert [len(y) for _, y in sets] == [1257, 270, 270]  # 1797 = 70/15/15 with the eval splits rounded up
    # Every original sample appears in exactly one split (compared as whole images + label rows).
    rows = torch.cat([torch.cat([x.flatten(1), y[:, None].float()], 1) for x, y in sets])
    digits = load_digits()
    original = torch.cat(
        [torch.tensor(digits.data, dtype=torch.float32) / 16.0, torch.tensor(digits.target)[:, None].float()], 1
    )
    assert sorted(map(tuple, rows.tolist())) == sorted(map(tuple, original.tolist()))
    # Images are scaled to [0, 1]; the split ignores the run's seed and follows split_seed.
    assert sets[0][0].min() == 0.0 and sets[0][0].max() == 1.0
    os.environ["PL_GLOBAL_SEED"] = "7"
    assert torch.equal(_datamodule().split_tensors("test")[1], sets[2][1])
    assert not torch.equal(_datamodule(split_seed=99).split_tensors("test")[1], sets[2][1])


def _epoch_order(seed: str, epoch: int) -> list[int]:
    os.environ["PL_GLOBAL_SEED"] = seed
    loader = _datamodule(batch_size=1257).train_dataloader()
    loader.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
    return list(iter(loader.sampler))


@pytest.mark.guarantee(
    "the split is disjoint, complete and fixed by its own seed; the training order depends only on the run's seed "
    "and the epoch; every loader setting comes from the DataModule"
)
def test_train_order_depends_only_on_run_seed_and_epoch() -> None:
    assert _epoch_order("1", 0) == _epoch_order("1", 0)
    assert sorted(_epoch_order("1", 0)) == list(range(1257))
    assert _epoch_order("1", 0) != _epoch_order("1", 1)
    assert _epoch_order("1", 0) != _epoch_order("2", 0)


@pytest.mark.guarantee("DDP val/test metrics are exact on odd-sized splits (no padded duplicates)")
@pytest.mark.parametrize(("n", "world"), [(5, 2), (270, 2), (7, 3), (4, 4)])
def test_unpadded_eval_sampler_sees_every_sample_exactly_once(n: int, world: int) -> None:
    dataset = list(range(n))
    shards = [list(UnpaddedDistributedSampler(dataset, world, rank)) for rank in range(world)]  # type: ignore[arg-type]
    assert sorted(i for shard in shards for i in shard) == list(range(n))
    assert [len(UnpaddedDistributedSampler(dataset, world, r)) for r in range(world)] == [len(s) for s in shards]  # type: ignore[arg-type]


@pytest.mark.guarantee(
    "the split is disjoint, complete and fixed by its own seed; the training order depends only on the run's seed "
    "and the epoch; every loader setting comes from the DataModule"
)
def test_loader_settings_come_from_the_datamodule() -> None:
    dm = _datamodule(batch_size=32, num_workers=2, prefetch_factor=3, drop_last=True, persistent_workers=True)
    loader = dm.train_dataloader()
    assert (loader.batch_size, loader.num_workers, loader.prefetch_factor) == (32, 2, 3)
    assert loader.drop_last and loader.persistent_workers and not loader.pin_memory
    assert len(loader) == 1257 // 32
    # Worker-only settings are dropped when there are no workers (DataLoader would reject them).
    plain = _datamodule(num_workers=0, persistent_workers=True).val_dataloader()
    assert plain.num_workers == 0 and not plain.persistent_workers and plain.prefetch_factor is None
    x, y = next(iter(plain))
    assert x.shape == (64, 1, 8, 8) and x.dtype == torch.float32 and y.dtype == torch.int64


@pytest.mark.guarantee(
    "the training sampler hands out torch's DistributedSampler order (seed + epoch, tail dropped, rank r every W-th) "
    "and skips a resumed epoch's first samples, holding the order as a tensor, never as torch's list of Python ints"
)
@pytest.mark.parametrize("count", [10, 1419, 100_003])
def test_the_training_order_is_torchs_distributed_sampler_order(count: int) -> None:
    data = range(count)
    for world in (1, 2, 3):
        for rank in range(world):
            for epoch in (0, 3):
                theirs = DistributedSampler(data, world, rank, shuffle=True, seed=42, drop_last=True)  # type: ignore[arg-type]
                ours = ResumableSampler(data, world, rank, shuffle=True, seed=42, drop_last=True)
                theirs.set_epoch(epoch)
                ours.set_epoch(epoch)
                order = list(theirs)
                assert list(ours) == order and len(ours) == len(order)
                ours.skip_next(7)
                assert list(ours) == order[7:]
