"""The shipped tasks beyond what the contract suite checks on every task: the regressor is judged in its target's
units everywhere downstream, the classification path refuses a continuous target, the engine's accumulation
correction holds for a task with its own training_step, and the one-file custom task is the README's."""

import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import DIGITS, REGRESSION, ROOT, fit, scalars
from probes import Recorder

from project.engine.cli import main
from project.engine.runs import table

SHORT = ("--trainer.max_epochs=3", "--trainer.enable_progress_bar=false")


def _scaled(source: Path, path: Path, factor: float) -> Path:
    """The regression table with its target multiplied by ``factor``."""
    with open(source) as f:
        rows = list(csv.reader(f))
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(rows[0])
        writer.writerows([*row[:-1], repr(float(row[-1]) * factor)] for row in rows[1:])
    return path


@pytest.mark.slow
def test_the_regressor_is_judged_and_predicts_in_its_targets_units(
    regression_csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from project.engine.export import export

    big = _scaled(regression_csv, tmp_path / "big.csv", 1e4)
    runs = {}
    for name, data in (("plain", regression_csv), ("big", big)):
        cli = fit(tmp_path / name, f"--data.path={data}", *SHORT, configs=(DIGITS, REGRESSION))
        runs[name] = (Path(cli.trainer.log_dir), cli)
    out = capsys.readouterr().out
    run, cli = runs["plain"]
    # The best checkpoint and early stopping follow the task's metric, val/rmse, minimised.
    checkpoint, stopper = cli.trainer.checkpoint_callback, cli.trainer.early_stopping_callback
    assert (checkpoint.monitor, checkpoint.mode, stopper.monitor, stopper.mode) == ("val/rmse", "min") * 2
    val_rmse = [v for _, v in scalars(run)["val/rmse"]]
    assert float(checkpoint.best_model_score) == pytest.approx(min(val_rmse), rel=1e-6)
    assert re.search(r"test/rmse=[0-9.]+ .*best val/rmse=", out)
    # Standardised targets make training blind to the target's scale: the same run on targets x 1e4 ends with
    # its RMSE x 1e4. Only float32 rounding differs (~6e-8 relative, grown at most ~100x over these ~60 steps;
    # measured 7e-8). Metrics on the net's standardised outputs miss this by 1.6e-3, predictions (below) by ~1e6.
    (_, plain), *_ = scalars(run)["test/rmse"]
    (_, scaled), *_ = scalars(runs["big"][0])["test/rmse"]
    assert scaled == pytest.approx(1e4 * plain, rel=1e-5)
    # Predictions are one number per row in the target's units: their RMSE against the true targets is test/rmse.
    big_run, big_cli = runs["big"]
    main(["predict", "--config", str(big_run / "config.yaml"), f"--ckpt_path={big_run / 'checkpoints' / 'best.ckpt'}"])
    with open(big_run / "predictions.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["index", "predicted_progression"]
    _, targets = big_cli.datamodule.split_tensors("test")
    predicted = torch.tensor([float(r["predicted_progression"]) for r in rows])
    rmse = (predicted - targets.flatten()).square().mean().sqrt().item()
    assert rmse == pytest.approx(scaled, rel=1e-4)  # the CSV holds 6 significant digits
    # The export holds values of size 1e6 to the same relative precision, and names the target and its units.
    metadata = export(big_run / "checkpoints" / "best.ckpt")
    assert metadata["output"]["name"] == "values" and metadata["output"]["targets"] == ["progression"]
    assert all(metadata["parity"][k]["max_rel_diff"] <= 1e-4 for k in ("onnx", "pt2"))
    assert json.loads((big_run / "checkpoints" / "model.json").read_text())["output"]["units"].startswith("the targ")
    # make runs shows the judged metric's columns.
    header = table(tmp_path / "plain").splitlines()[0].split()
    assert header[6:10] == ["best", "val/rmse", "test/rmse", "commit"]


def test_the_sweep_optimises_the_tasks_metric_unless_told_otherwise(regression_csv: Path, tmp_path: Path) -> None:
    from project.engine.sweep import spec as sweep_spec

    path = tmp_path / "sweep.yaml"
    path.write_text(
        f"configs: [{DIGITS}, {REGRESSION}]\nargs: [--data.path={regression_csv}]\n"
        "params:\n  model.lr: {low: 1.0e-3, high: 1.0e-2}\n"
    )
    spec = sweep_spec.load(path)
    sweep_spec.check_against_cli(spec)
    assert (spec.metric, spec.direction) == ("val/rmse", "minimize")
    path.write_text(path.read_text() + "metric: val/mae\n")
    with pytest.raises(sweep_spec.ConfigError, match="give its direction"):
        sweep_spec.check_against_cli(sweep_spec.load(path))


def test_a_continuous_target_on_the_classification_path_is_refused_naming_the_regression_config(
    regression_csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    csv_config = str(ROOT / "configs" / "data" / "csv.yaml")
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", DIGITS, "--config", csv_config, f"--data.path={regression_csv}",
              "--data.target=progression", f"--trainer.logger.init_args.save_dir={tmp_path}"])  # fmt: skip
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "holds 214 distinct integers in 442 rows" in err and "configs/tasks/regression.yaml" in err
    assert "Traceback" not in err and not any(tmp_path.rglob("*.ckpt"))


@pytest.mark.slow
def test_the_accumulation_correction_holds_for_a_task_with_its_own_training_step(tmp_path: Path) -> None:
    # 91 moons: 63 training points. Batch 3 x 4 micro-batches: 5 windows of 4 and a last window of 1 micro-batch;
    # batch 12: 5 batches of 12 and a last one of 3, the same samples in the same order.
    common = ("--data=project.data.moons.MoonsDataModule", "--data.samples=91", "--data.normalize=true",
              "--model=probes.OwnTrainingStep", "--model.net=project.nets.MLP", "--trainer.precision=64-true",
              "--trainer.max_epochs=1", "--trainer.limit_val_batches=0", "--trainer.callbacks+=probes.NoDropout",
              "--trainer.callbacks+=probes.Recorder", "--trainer.callbacks.keep_grads=true")  # fmt: skip
    runs = []
    for batch, k in ((3, 4), (12, 1)):
        cli = fit(tmp_path / f"{batch}", *common, f"--data.batch_size={batch}",
                  f"--trainer.accumulate_grad_batches={k}")  # fmt: skip
        runs.append(next(cb for cb in cli.trainer.callbacks if isinstance(cb, Recorder)))
    small, large = runs
    assert [i for b in small.batches() for i in b] == [i for b in large.batches() for i in b]
    assert len(small.grads) == len(large.grads) == 6
    # float64: summation order alone differs (~1e-16 relative per op); 1e-9 leaves 10^6 for the net's depth. The
    # uncorrected tail step (a quarter of its gradient: Lightning #19987) is O(1) off.
    for step, (a, b) in enumerate(zip(small.grads, large.grads, strict=True)):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11, msg=f"gradient of step {step}")
    assert not torch.allclose(small.grads[-1] * 0.25, large.grads[-1], rtol=1e-9, atol=1e-11)


def test_the_custom_task_is_one_short_file_shown_verbatim_in_the_readme() -> None:
    source = (ROOT / "project" / "tasks" / "multilabel.py").read_text()
    assert len(source.splitlines()) <= 60
    body = source.split('"""', 2)[2].lstrip("\n")  # the file without its docstring
    assert f"```python\n{body}```" in (ROOT / "README.md").read_text(), "README's custom task differs from the file"


@pytest.mark.parametrize("kind", ["mse", "huber"])
def test_the_regressors_loss_is_its_closed_form_on_standardised_targets(kind: str) -> None:
    from project.tasks import Regressor

    task = Regressor(net=torch.nn.Identity(), target_names=["a", "b"], loss=kind, huber_delta=1.0)
    task.targets.mean.copy_(torch.tensor([100.0, -3.0]))
    task.targets.std.copy_(torch.tensor([10.0, 0.5]))
    targets = torch.tensor([[110.0, -3.0], [100.0, -1.0]])  # standardised: [[1, 0], [0, 4]]
    outputs = torch.tensor([[0.5, 0.0], [0.0, 0.0]])  # errors in z: [[-0.5, 0], [0, -4]]
    # MSE: mean over targets of e^2; Huber (delta 1): e^2 / 2 within 1, |e| - 1/2 beyond.
    expected = {"mse": [(0.25 + 0) / 2, (0 + 16) / 2], "huber": [(0.125 + 0) / 2, (0 + 3.5) / 2]}[kind]
    torch.testing.assert_close(task.loss(outputs, targets), torch.tensor(expected))
    assert task.prediction(outputs).tolist() == [[105.0, -3.0], [100.0, -3.0]]  # back in the targets' units


def test_the_classifiers_metrics_are_their_closed_forms_and_any_of_them_judges_the_run() -> None:
    """Each metric the Classifier offers equals scikit-learn's definition on the same scores (to float32 rounding:
    1e-6); ``model.monitor`` names the one that judges the run, with its own direction."""
    from sklearn import metrics as sk
    from sklearn.preprocessing import label_binarize

    from project.engine.errors import ConfigError
    from project.tasks.classification import Classifier

    names = ["acc", "balanced_acc", "macro_f1", "auroc", "average_precision"]
    task = Classifier(net=torch.nn.Identity(), target_names=["a", "b", "c"], metrics=names, monitor="val/auroc")
    assert (task.monitor, task.mode) == ("val/auroc", "max")
    logits = torch.randn(200, 3, generator=torch.Generator().manual_seed(0))
    targets = torch.multinomial(torch.tensor([0.7, 0.2, 0.1]), 200, True, generator=torch.Generator().manual_seed(1))
    logits[targets == 0, 0] += 1.0  # a better-than-chance model of imbalanced classes...
    logits[:, 0] += 1.5  # ...that favours the frequent class
    task.update_metrics(task.val_metrics, logits, targets)
    got = {k.removeprefix("val/"): float(v) for k, v in task.val_metrics.compute().items()}
    y, predicted, probs = targets.numpy(), logits.argmax(1).numpy(), logits.softmax(1).numpy()
    want = {
        "acc": sk.accuracy_score(y, predicted),
        "balanced_acc": sk.balanced_accuracy_score(y, predicted),
        "macro_f1": sk.f1_score(y, predicted, average="macro"),
        "auroc": sk.roc_auc_score(y, probs, multi_class="ovr", average="macro"),
        "average_precision": sk.average_precision_score(label_binarize(y, classes=[0, 1, 2]), probs, average="macro"),
    }
    assert got == pytest.approx(want, abs=1e-6)
    assert got["acc"] > 0.6 > got["balanced_acc"]  # what accuracy hides on imbalanced classes
    assert Classifier(net=torch.nn.Identity(), target_names=["a", "b"], monitor="val/loss").mode == "min"
    with pytest.raises(ConfigError, match=re.escape("model.monitor='val/f1': Classifier logs val/acc, val/loss")):
        Classifier(net=torch.nn.Identity(), target_names=["a", "b"], monitor="val/f1")


def test_balanced_class_weights_are_scikit_learns_from_the_training_split() -> None:
    from types import SimpleNamespace

    import torch.nn.functional as F
    from sklearn.utils.class_weight import compute_class_weight

    from project.engine.errors import ConfigError
    from project.tasks.classification import Classifier

    train = torch.tensor([0, 0, 0, 0, 0, 0, 1, 1, 1, 2])  # counts 6, 3, 1
    task = Classifier(net=torch.nn.Identity(), target_names=["a", "b", "c"], class_weights="balanced")
    datamodule = SimpleNamespace(split_targets=lambda split: {"train": train}[split])
    task._trainer = SimpleNamespace(datamodule=datamodule, strategy=SimpleNamespace(root_device=torch.device("cpu")))
    task.setup("fit")
    want = compute_class_weight("balanced", classes=np.arange(3), y=train.numpy())  # 10 / (3 x count)
    torch.testing.assert_close(task.class_weights, torch.tensor(want, dtype=torch.float32))
    assert "class_weights" in task.state_dict()  # kept in the checkpoint: a resumed run weighs the same
    logits, targets = torch.randn(5, 3, generator=torch.Generator().manual_seed(0)), torch.tensor([0, 1, 2, 2, 0])
    plain = F.cross_entropy(logits, targets, reduction="none")
    torch.testing.assert_close(task.loss(logits, targets), plain * torch.tensor(want[targets], dtype=torch.float32))
    unweighted = Classifier(net=torch.nn.Identity(), target_names=["a", "b", "c"])
    torch.testing.assert_close(unweighted.loss(logits, targets), plain)
    datamodule.split_targets = lambda split: torch.tensor([0, 0, 1])  # no "c" in the training split
    with pytest.raises(ConfigError, match=re.escape("the training split has no sample of ['c']")):
        task.setup("fit")


@pytest.mark.slow
def test_the_metric_named_in_the_config_picks_the_best_checkpoint_and_the_sweeps_metric(tmp_path: Path) -> None:
    from project.engine.sweep import spec as sweep_spec

    chosen = ("--model.metrics=[acc,balanced_acc]", "--model.monitor=val/balanced_acc")
    cli = fit(tmp_path, *chosen, *SHORT)
    checkpoint, stopper = cli.trainer.checkpoint_callback, cli.trainer.early_stopping_callback
    assert (checkpoint.monitor, checkpoint.mode, stopper.monitor, stopper.mode) == ("val/balanced_acc", "max") * 2
    logged = [v for _, v in scalars(Path(cli.trainer.log_dir))["val/balanced_acc"]]
    assert float(checkpoint.best_model_score) == pytest.approx(max(logged), rel=1e-6)
    path = tmp_path / "sweep.yaml"
    path.write_text(
        f"configs: [{DIGITS}]\nargs: {json.dumps(chosen)}\nparams:\n  model.lr: {{low: 1.0e-3, high: 1.0e-2}}\n"
    )
    spec = sweep_spec.load(path)
    sweep_spec.check_against_cli(spec)
    assert (spec.metric, spec.direction) == ("val/balanced_acc", "maximize")
