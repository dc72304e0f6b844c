"""Starting from pretrained weights: model.init_from (an earlier run), a timm backbone with weights from a local
file and its pretraining statistics, freezing the backbone for N epochs and its LR multiplier."""

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from conftest import DIGITS, IMAGES, fit, scalars
from probes import Snapshots

from project.engine.errors import ConfigError
from project.engine.schedule import resolve_warmup_steps, warmup_cosine_lr

RESNET = ("--model.net=project.nets.ResNet", "--model.net.init_args.width=8", "--model.net.init_args.stages=2")
SHORT = ("--trainer.max_epochs=2", "--trainer.limit_train_batches=3", "--trainer.limit_val_batches=1",
         "--trainer.limit_test_batches=1", "--trainer.log_every_n_steps=1",
         "--trainer.callbacks+=probes.Snapshots")  # fmt: skip


def _run(save_dir: Path) -> Path:
    return save_dir / "images" / "version_0"


@pytest.fixture(scope="module")
def other_classes(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """As many classes as image_folder but other ones (the images relabelled): its head fits in shape, not in
    meaning."""
    root = tmp_path_factory.mktemp("data") / "other"
    for name, other in (("circle", "ring"), ("square", "box"), ("triangle", "wedge")):
        shutil.copytree(image_folder / name, root / other)
    return root


@pytest.fixture(scope="module")
def earlier(image_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ResNet run on image_folder (3 classes): what the next runs start from."""
    save_dir = tmp_path_factory.mktemp("earlier")
    fit(save_dir, f"--data.root={image_folder}", *RESNET, *SHORT, configs=(DIGITS, IMAGES))
    return _run(save_dir)


@pytest.mark.slow
def test_init_from_an_earlier_run_loads_what_fits_and_leaves_the_head_new(
    earlier: Path, other_classes: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO):
        cli = fit(tmp_path, f"--data.root={other_classes}", *RESNET, *SHORT, f"--model.init_from={earlier}",
                  configs=(DIGITS, IMAGES))  # fmt: skip
    source = torch.load(earlier / "checkpoints" / "best.ckpt", weights_only=True)["state_dict"]
    start = Snapshots.taken["start"]
    head = {"head.3.weight", "head.3.bias"}  # 3 classes there and here, but other ones
    for name, value in start.items():
        if name in head:
            assert not torch.equal(value, source[f"net.{name}"]), name
        else:  # before the first step: exactly the earlier run's best weights, BatchNorm statistics included
            assert torch.equal(value, source[f"net.{name}"]), name
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("Loaded "))
    assert line.startswith(f"Loaded {len(start) - 2} of {len(start)} tensors from ") and "head.3.{weight,bias}" in line
    assert "the earlier run's targets were ['circle', 'square', 'triangle'], not ['box', 'ring', 'wedge']" in line
    # A fresh run: its own directory, optimizer and schedule from step 0, and the record of where it started.
    assert cli.trainer.global_step == 6 and scalars(_run(tmp_path))["train/loss"][0][0] == 0
    record = json.loads((_run(tmp_path) / "provenance.json").read_text())["segments"][0]
    assert record["initialized_from"]["init_from"]["path"] == str(earlier / "checkpoints" / "best.ckpt")
    assert record["initialized_from"]["init_from"]["left_new"] == sorted(head, reverse=True)


@pytest.mark.slow
def test_init_from_a_file_of_another_net_is_refused_and_leaves_no_run(image_folder: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.pth"
    torch.save({"encoder.weight": torch.zeros(3, 3)}, other)
    with pytest.raises(ConfigError, match=r"model.init_from=.*other.pth.*nothing in it fits this net"):
        fit(tmp_path / "logs", f"--data.root={image_folder}", *RESNET, *SHORT, f"--model.init_from={other}",
            configs=(DIGITS, IMAGES))  # fmt: skip
    assert not _run(tmp_path / "logs").exists()


@pytest.mark.slow
def test_a_frozen_backbone_trains_from_its_unfreeze_epoch_at_its_own_lr(image_folder: Path, tmp_path: Path) -> None:
    fit(tmp_path, f"--data.root={image_folder}", *RESNET, *SHORT, "--model.freeze_backbone=1",
        "--model.backbone_lr_scale=0.1", configs=(DIGITS, IMAGES))  # fmt: skip
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
        expected = [warmup_cosine_lr(s, lr * scale, min_lr * scale, warmup, total) for s in range(total)]
        assert logged == pytest.approx(expected, rel=1e-6), group


@pytest.mark.slow
def test_a_timm_backbone_starts_from_a_local_weights_file_with_its_pretraining_statistics(
    image_folder: Path, tmp_path: Path
) -> None:
    timm = pytest.importorskip("timm")
    from safetensors.torch import save_file

    from project.engine.export import export

    torch.manual_seed(0)
    pretrained = timm.create_model("test_resnet", num_classes=1000).state_dict()  # a 1000-class classifier: not ours
    weights = tmp_path / "test_resnet.safetensors"
    save_file({k: v.contiguous() for k, v in pretrained.items()}, str(weights))
    timm_net = ("--model.net=project.backbones.TimmNet", "--model.net.init_args.name=test_resnet",
                f"--model.net.init_args.weights={weights}")  # fmt: skip
    fit(tmp_path, f"--data.root={image_folder}", *timm_net, *SHORT, "--data.image_size=16", configs=(DIGITS, IMAGES))
    start = Snapshots.taken["start"]
    for name, value in start.items():
        if name.startswith("backbone."):
            assert torch.equal(value, pretrained[name.removeprefix("backbone.")]), name
    checkpoint = torch.load(_run(tmp_path) / "checkpoints" / "last.ckpt", weights_only=True)
    cfg = timm.create_model("test_resnet").pretrained_cfg
    assert checkpoint["ImageFolderDataModule"]["normalization"] == {"mean": list(cfg["mean"]), "std": list(cfg["std"])}
    metadata = export(_run(tmp_path) / "checkpoints" / "best.ckpt")  # raises ParityError past its tolerance
    checks = [v for v in metadata["parity"].values() if isinstance(v, dict)]
    assert len(checks) == 2 and all(check["max_rel_diff"] <= 1e-4 for check in checks)

    # The data config's own choice wins: the training split's statistics.
    fit(tmp_path / "own", f"--data.root={image_folder}", *timm_net, *SHORT, "--data.image_size=16",
        "--data.normalize=train", configs=(DIGITS, IMAGES))  # fmt: skip
    own = torch.load(_run(tmp_path / "own") / "checkpoints" / "last.ckpt", weights_only=True)
    assert own["ImageFolderDataModule"]["normalization"]["mean"] != list(cfg["mean"])


def test_weights_asked_of_timm_but_not_in_the_local_cache_say_what_to_fetch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("timm")
    import huggingface_hub

    from project.backbones import TimmNet

    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda *args, **kwargs: None)
    net = TimmNet((3, 16, 16), 2, name="resnet10t", weights="timm")
    with pytest.raises(ConfigError, match=r"not in the local Hugging Face cache.*huggingface.co/timm/resnet10t"):
        net.load_pretrained()


def test_fine_tuning_a_net_without_a_backbone_is_refused_naming_the_nets_that_have_one() -> None:
    from project.nets import ConvNet
    from project.tasks import Classifier

    with pytest.raises(ConfigError, match=r"ConvNet declares no backbone.*project.nets.ResNet"):
        Classifier(net=ConvNet((1, 8, 8), 10), freeze_backbone=2)


def test_a_tensor_shaped_differently_is_left_new_and_named() -> None:
    from project.engine.weights import load_matching
    from project.nets import ResNet

    torch.manual_seed(0)
    three, two = ResNet((3, 8, 8), 3, width=4, stages=1), ResNet((3, 8, 8), 2, width=4, stages=1)
    before = {k: v.clone() for k, v in two.state_dict().items()}
    loaded = load_matching(two, three.state_dict(), "three.pth", "model.init_from")
    assert loaded.new == ["head.3.weight", "head.3.bias"]
    for name, value in two.state_dict().items():
        assert torch.equal(value, before[name] if name in loaded.new else three.state_dict()[name]), name


def test_the_fine_tuning_sweep_searches_the_backbone_lr_multiplier(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("optuna")
    from conftest import ROOT

    from project.engine.sweep.spec import check_against_cli, load

    monkeypatch.chdir(ROOT)  # the sweep file's configs are relative to the checkout; parsing writes nothing
    spec = load("configs/sweeps/finetune.yaml")
    assert "model.backbone_lr_scale" in spec.params
    check_against_cli(spec)  # every searched key at both ends of its range, as the CLI parses it
