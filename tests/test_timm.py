"""The timm example (project/backbones.py, configs/nets/*.yaml): a timm backbone with weights from a local file and
its pretraining statistics, and the fine-tuning sweep."""

from pathlib import Path

import pytest
import torch
from conftest import DIGITS, IMAGES, fit
from probes import Snapshots

from project.engine import ConfigError

# make install removes timm where its torchvision cannot load beside the installed torch (the Makefile says why).
NO_TIMM = "timm (the timm extra) is not installed, or was removed because its torchvision cannot load beside this torch"
SHORT = ("--trainer.max_epochs=2", "--trainer.limit_train_batches=3", "--trainer.limit_val_batches=1",
         "--trainer.limit_test_batches=1", "--trainer.log_every_n_steps=1",
         "--trainer.callbacks+=probes.Snapshots")  # fmt: skip


def _run(save_dir: Path) -> Path:
    return save_dir / "images" / "version_0"


@pytest.mark.guarantee(
    "a timm backbone starts from a local weights file (its tensors equal the file's, the classifier left out), "
    "normalises with its pretraining statistics unless `data.normalize: train`, and exports to ONNX and "
    "torch.export with parity",
)
@pytest.mark.slow
def test_a_timm_backbone_starts_from_a_local_weights_file_with_its_pretraining_statistics(
    image_folder: Path, tmp_path: Path
) -> None:
    timm = pytest.importorskip("timm", reason=NO_TIMM)
    from safetensors.torch import save_file

    from project.engine.inference.export import export

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


@pytest.mark.guarantee(
    "timm weights not in the local cache, or fine-tuning controls on a net without a backbone: one sentence naming "
    "what to fetch or what a backbone is"
)
def test_weights_asked_of_timm_but_not_in_the_local_cache_say_what_to_fetch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("timm", reason=NO_TIMM)
    import huggingface_hub

    from project.backbones import TimmNet

    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda *args, **kwargs: None)
    net = TimmNet((3, 16, 16), 2, name="resnet10t", weights="timm")
    with pytest.raises(ConfigError, match=r"not in the local Hugging Face cache.*huggingface.co/timm/resnet10t"):
        net.load_pretrained()


@pytest.mark.guarantee(
    "`configs/sweeps/finetune.yaml` searches `model.backbone_lr_scale`: every searched key parses at both ends of "
    "its range",
)
def test_the_fine_tuning_sweep_searches_the_backbone_lr_multiplier(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("optuna")
    from conftest import ROOT

    from project.engine.sweep.spec import check_against_cli, load

    monkeypatch.chdir(ROOT)  # the sweep file's configs are relative to the checkout; parsing writes nothing
    spec = load("configs/sweeps/finetune.yaml")
    assert "model.backbone_lr_scale" in spec.params
    check_against_cli(spec)  # every searched key at both ends of its range, as the CLI parses it
