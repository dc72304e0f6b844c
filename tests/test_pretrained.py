"""Starting from pretrained weights: model.init_from (an earlier run or a weights file), freezing the backbone for
N epochs and its LR multiplier (a timm backbone's weights and statistics: tests/test_timm.py)."""

import json
import logging
from pathlib import Path

import pytest
import torch
from conftest import fit, scalars, warmup_cosine
from probes import Snapshots

from project.engine import ConfigError, resolve_warmup_steps

BACKBONE = ("--model.net=toy.BackboneNet",)
EARLIER, OTHER = "--data.digits=[0,1,2]", "--data.digits=[3,4,5]"  # as many classes, other ones
SHORT = ("--trainer.max_epochs=2", "--trainer.limit_train_batches=3", "--trainer.limit_val_batches=1",
         "--trainer.limit_test_batches=1", "--trainer.log_every_n_steps=1",
         "--trainer.callbacks+=probes.Snapshots")  # fmt: skip


def _run(save_dir: Path) -> Path:
    return save_dir / "digits" / "version_0"


@pytest.fixture(scope="module")
def earlier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run on the digits 0-2 (3 classes): what the next runs start from."""
    save_dir = tmp_path_factory.mktemp("earlier")
    fit(save_dir, EARLIER, *BACKBONE, *SHORT)
    return _run(save_dir)


@pytest.mark.guarantee(
    "`model.init_from` loads every tensor of an earlier run whose name and shape match, equal to it before the "
    "first step (BatchNorm statistics too), leaves the head for other classes new, says how many in one line and "
    "records the file in provenance; a fresh run from step 0"
)
@pytest.mark.slow
def test_init_from_an_earlier_run_loads_what_fits_and_leaves_the_head_new(
    earlier: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO):
        cli = fit(tmp_path, OTHER, *BACKBONE, *SHORT, f"--model.init_from={earlier}")
    source = torch.load(earlier / "checkpoints" / "best.ckpt", weights_only=True)["state_dict"]
    start = Snapshots.taken["start"]
    head = {"head.2.weight", "head.2.bias"}  # 3 classes there and here, but other ones
    for name, value in start.items():
        if name in head:
            assert not torch.equal(value, source[f"net.{name}"]), name
        else:  # before the first step: exactly the earlier run's best weights, BatchNorm statistics included
            assert torch.equal(value, source[f"net.{name}"]), name
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("Loaded "))
    assert line.startswith(f"Loaded {len(start) - 2} of {len(start)} tensors from ") and "head.2.{weight,bias}" in line
    assert "the earlier run's targets were ['0', '1', '2'], not ['3', '4', '5']" in line
    # A fresh run: its own directory, optimizer and schedule from step 0, and the record of where it started.
    assert cli.trainer.global_step == 6 and scalars(_run(tmp_path))["train/loss"][0][0] == 0
    record = json.loads((_run(tmp_path) / "provenance.json").read_text())["segments"][0]
    assert record["initialized_from"]["init_from"]["path"] == str(earlier / "checkpoints" / "best.ckpt")
    assert record["initialized_from"]["init_from"]["left_new"] == sorted(head, reverse=True)


@pytest.mark.guarantee("a weights file in which nothing fits is refused in one sentence, leaving no run directory")
@pytest.mark.slow
def test_init_from_a_file_of_another_net_is_refused_and_leaves_no_run(tmp_path: Path) -> None:
    other = tmp_path / "other.pth"
    torch.save({"encoder.weight": torch.zeros(3, 3)}, other)
    with pytest.raises(ConfigError, match=r"model.init_from=.*other.pth.*nothing in it fits this net"):
        fit(tmp_path / "logs", *BACKBONE, *SHORT, f"--model.init_from={other}")
    assert not _run(tmp_path / "logs").exists()


@pytest.mark.guarantee(
    "a frozen backbone (weights and BatchNorm statistics) is unchanged before its unfreeze epoch and trained "
    "after; every param group's logged LR is the warmup+cosine closed form times its multiplier"
)
@pytest.mark.slow
def test_a_frozen_backbone_trains_from_its_unfreeze_epoch_at_its_own_lr(tmp_path: Path) -> None:
    fit(tmp_path, *BACKBONE, *SHORT, "--model.freeze_backbone=1", "--model.backbone_lr_scale=0.1")
    start, first, second = Snapshots.taken["start"], Snapshots.taken[0], Snapshots.taken[1]
    backbone = [n for n in start if n.startswith("backbone.")]
    assert any("running_mean" in n for n in backbone)  # BatchNorm's statistics are among them
    for name in backbone:  # epoch 0: frozen, weights and BatchNorm statistics alike
        assert torch.equal(first[name], start[name]), name
    assert all(not torch.equal(second[n], first[n]) for n in backbone if not n.endswith("num_batches_tracked"))
    assert all(not torch.equal(first[n], start[n]) for n in start if n.startswith("head."))
    # Every group follows the warmup+cosine closed form from its own initial lr: the backbone's is lr x 0.1.
    lr, min_lr, total = 3e-3, 1e-5, 6
    warmup = resolve_warmup_steps(0.05, total)
    curves = scalars(_run(tmp_path))
    for group, scale in (("backbone/decay", 0.1), ("backbone/no_decay", 0.1), ("head/decay", 1), ("head/no_decay", 1)):
        logged = [v for _, v in curves[f"lr-AdamW/{group}"]]
        expected = [warmup_cosine(s, lr * scale, min_lr * scale, warmup, total) for s in range(total)]
        assert logged == pytest.approx(expected, rel=1e-6), group


@pytest.mark.guarantee(
    "timm weights not in the local cache, or fine-tuning controls on a net without a backbone: one sentence naming "
    "what to fetch or what a backbone is"
)
def test_fine_tuning_a_net_without_a_backbone_is_refused_saying_what_a_backbone_is() -> None:
    from toy import Classifier, ConvNet

    with pytest.raises(ConfigError, match=r"ConvNet declares no backbone: .* names its pretrained part self\.backbone"):
        Classifier(net=ConvNet((1, 8, 8), 10), freeze_backbone=2)


def test_a_tensor_shaped_differently_is_left_new_and_named() -> None:
    from toy import BackboneNet

    from project.engine import load_matching

    torch.manual_seed(0)
    three, two = BackboneNet((3, 8, 8), 3, width=4), BackboneNet((3, 8, 8), 2, width=4)
    before = {k: v.clone() for k, v in two.state_dict().items()}
    loaded = load_matching(two, three.state_dict(), "three.pth", "model.init_from")
    assert loaded.new == ["head.2.weight", "head.2.bias"]
    for name, value in two.state_dict().items():
        assert torch.equal(value, before[name] if name in loaded.new else three.state_dict()[name]), name
