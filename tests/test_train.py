"""The default run through the CLI: it learns, and its run directory holds what the manual promises (docs/usage.md,
Runs, logs and checkpoints)."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from conftest import DEBUG, DIGITS, accuracy, fit, scalars
from toy import Classifier

EXPECTED_TAGS = {
    "train/loss", "val/loss", "val/loss_se", "val/acc", "test/loss", "test/loss_se", "test/acc", "lr-AdamW/decay",
    "lr-AdamW/no_decay",
    "train/grad_norm", "train/samples_per_sec", "train/batches_per_sec", "train/samples_per_sec_global",
    "train/data_wait", "train/peak_rss_mb", "hp/val_acc", "hp/test_acc", "hp/test_loss", "hp/test_loss_se",
}  # fmt: skip


def _is_plain(value: object) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_plain(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return all(_is_plain(v) for v in value)
    return value is None or isinstance(value, str | int | float | bool)


@pytest.mark.guarantee(
    "the default config learns; `val/acc`, `test/acc` logged equal accuracies computed by hand from the checkpoints"
)
@pytest.mark.slow
def test_default_config_learns_and_writes_a_complete_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cli = fit(tmp_path, "--trainer.max_epochs=2")
    run_dirs = sorted((tmp_path / "digits").iterdir())
    assert [d.name for d in run_dirs] == ["version_0"]
    run = run_dirs[0]

    # The resolved config is saved beside the logs and reflects the override.
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["trainer"]["max_epochs"] == 2
    assert config["model"]["init_args"]["net"]["class_path"] == "toy.ConvNet"
    assert config["data"]["class_path"] == "toy.Digits"
    assert config["data"]["init_args"]["batch_size"] == 64

    logged = scalars(run)
    assert logged.keys() >= EXPECTED_TAGS
    val_acc = [v for _, v in logged["val/acc"]]
    assert len(val_acc) == 2
    assert val_acc[-1] > 0.8, f"val/acc {val_acc} is not clearly above chance (0.1)"
    train_loss = [v for _, v in logged["train/loss"]]
    assert train_loss[-1] < 0.5 * train_loss[0]

    # Both checkpoints load without unpickling code, and hold only plain hyperparameters.
    ckpt_dir = run / "checkpoints"
    assert sorted(p.name for p in ckpt_dir.iterdir()) == ["best.ckpt", "last.ckpt"]
    steps_per_epoch = len(cli.datamodule.train_dataloader())
    last = torch.load(ckpt_dir / "last.ckpt", weights_only=True)
    assert last["global_step"] == 2 * steps_per_epoch
    best = torch.load(ckpt_dir / "best.ckpt", weights_only=True)
    assert _is_plain(best["hyper_parameters"]) and _is_plain(best["datamodule_hyper_parameters"])
    assert best["epoch"] == max(range(2), key=lambda e: val_acc[e])

    # The best checkpoint rebuilds the net from its hparams alone, and its accuracy computed by hand matches
    # what the run logged: val/acc at the best epoch, and test/acc of the final test on the best checkpoint.
    model = Classifier.load_from_checkpoint(ckpt_dir / "best.ckpt", weights_only=True)
    dm = cli.datamodule
    assert accuracy(model, *dm.split_tensors("val")) == pytest.approx(max(val_acc), abs=1e-6)
    (test_acc,) = [v for _, v in logged["test/acc"]]
    assert accuracy(model, *dm.split_tensors("test")) == pytest.approx(test_acc, abs=1e-6)
    # test/loss is the mean over samples, not a mean of batch means: batches of 64 leave a last one of 14 of the
    # 270, which a mean of batch means would weight as a full one. float32 sums of 270 terms round at ~1e-7.
    images, labels = dm.split_tensors("test")
    assert len(labels) % dm.hparams["batch_size"] == 14
    with torch.no_grad():
        by_hand = F.cross_entropy(model.eval()(images), labels).item()
    assert [v for _, v in logged["test/loss"]] == [pytest.approx(by_hand, rel=1e-5)]
    out = capsys.readouterr().out
    assert f"Run directory: {run}" in out
    assert f"Test of {ckpt_dir / 'best.ckpt'}: test/acc={test_acc:.4f}" in out
    assert f"best val/acc={max(val_acc):.4f}" in out
    # The HPARAMS view: the final scores, logged beside the hyperparameters.
    assert logged["hp/test_acc"] == [(0, test_acc)] and logged["hp/val_acc"] == [(0, pytest.approx(max(val_acc)))]


@pytest.mark.guarantee("a new run never overwrites an old one")
@pytest.mark.slow
def test_a_second_run_gets_its_own_directory(tmp_path: Path) -> None:
    fit(tmp_path, configs=(DIGITS, DEBUG))
    first = {p: p.read_bytes() for p in (tmp_path / "debug" / "version_0").rglob("*") if p.is_file()}
    fit(tmp_path, configs=(DIGITS, DEBUG))
    assert sorted(d.name for d in (tmp_path / "debug").iterdir()) == ["version_0", "version_1"]
    assert {p: p.read_bytes() for p in first} == first


def test_hand_built_model_keeps_only_plain_hparams() -> None:
    from toy import MLP

    model = Classifier(
        net=MLP((1, 8, 8), 10, hidden=16), target_names=[str(d) for d in range(10)], optimizer=torch.optim.SGD, warmup=3
    )
    assert "net" not in model.hparams and "optimizer" not in model.hparams and "schedule" not in model.hparams
    assert model.hparams["warmup"] == 3
    assert _is_plain(dict(model.hparams))
