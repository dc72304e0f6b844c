"""The regression example (project/tasks/regression.py, configs/tasks/regression.yaml): judged and predicted in
its target's units everywhere downstream, its loss's closed form, and the classification path refusing a
continuous target."""

import csv
import json
import re
from pathlib import Path

import bench  # benchmarks/ (conftest puts it on the path)
import pytest
import torch
import yaml
from conftest import DIGITS, REGRESSION, ROOT, fit, scalars

from project.engine import main
from project.engine.observe.runs import table

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


@pytest.mark.guarantee(
    "the task is chosen by `model.class_path` and is the only code that knows the task: the Regressor's best "
    "checkpoint and early stopping follow `val/rmse` (min); its scores, predictions and export are in the target's "
    "units (the same run on targets x 1e4 ends with its RMSE x 1e4, to 1e-5); `make runs` shows its columns"
)
@pytest.mark.slow
def test_the_regressor_is_judged_and_predicts_in_its_targets_units(
    regression_csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from project.engine.inference.export import export

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


@pytest.mark.guarantee(
    "the sweep optimises the task's metric in its direction unless the file names another (the language model's "
    "sweep: `val/loss`, min)"
)
def test_the_sweep_optimises_the_tasks_metric_unless_told_otherwise(regression_csv: Path, tmp_path: Path) -> None:
    from project.engine.sweep import spec as sweep_spec

    path = tmp_path / "sweep.yaml"
    path.write_text(
        f"configs: [{DIGITS}, {REGRESSION}]\nargs: [--data.path={regression_csv}]\n"
        "params:\n  model.optimizer.init_args.lr: {low: 1.0e-3, high: 1.0e-2}\n"
    )
    spec = sweep_spec.load(path)
    sweep_spec.check_against_cli(spec)
    assert (spec.metric, spec.direction) == ("val/rmse", "minimize")
    path.write_text(path.read_text() + "metric: val/mae\n")
    with pytest.raises(sweep_spec.ConfigError, match="give its direction"):
        sweep_spec.check_against_cli(sweep_spec.load(path))


@pytest.mark.guarantee(
    "a continuous target given to the classification path, or a task whose targets the data does not serve, is "
    "refused in one sentence naming the regression config"
)
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
    # Written with every digit a float32 holds: a price is not rounded to whole units.
    assert task.prediction_table(torch.tensor([[431756.31, 0.5]])) == (
        ["predicted_a", "predicted_b"],
        [["431756.3", "0.5"]],
    )


def test_the_regression_overlay_switches_the_task_and_the_data_keeps_only_its_own_settings(
    capsys: pytest.CaptureFixture[str],
) -> None:
    regression = str(ROOT / "configs" / "tasks" / "regression.yaml")
    with pytest.raises(SystemExit):
        main(["fit", "--config", DIGITS, "--config", regression, "--print_config"])
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["class_path"] == "project.tasks.Regressor"
    assert "label_smoothing" not in printed["model"]["init_args"]  # the Classifier's own argument is dropped
    assert printed["model"]["init_args"]["optimizer"]["init_args"]["lr"] == 0.003  # the engine's carry over
    assert printed["data"]["init_args"]["target_type"] == "value"
    # Switching the data by class alone: digits' settings that the new class shares carry over (batch size), but
    # digits' own default (no normalisation: its pixels are in [0, 1]) is not inherited by a table.
    with pytest.raises(SystemExit):
        main(["fit", "--config", DIGITS, "--data=project.data.CSVDataModule", "--data.path=t.csv",
              "--data.target=y", "--print_config"])  # fmt: skip
    data = yaml.safe_load(capsys.readouterr().out)["data"]["init_args"]
    assert data["normalize"] is True and data["batch_size"] == 64


@pytest.mark.guarantee(
    "the hand-written reference loop and the template do the same work (the same val acc; the same val RMSE on a "
    "regression; the language model's trajectory)"
)
@pytest.mark.slow
def test_the_hand_written_loop_replays_the_regression_task_too(
    tmp_path: Path, regression_csv: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The bench reads its workload's flags from WORKLOADS: here, the regression fixture over the engine's config.
    monkeypatch.setitem(bench.WORKLOADS, "regression", {"args": ["--config", REGRESSION,
                        f"--data.path={regression_csv}"], "epochs": 2})  # fmt: skip
    bench.write_spec(DIGITS, "regression", 2, tmp_path / "spec.pt")
    reference = bench.run_reference(tmp_path / "spec.pt")
    template = bench.run_template(DIGITS, "regression", epochs=2, save_dir=str(tmp_path))
    assert reference["steps_per_epoch"] == template["steps_per_epoch"]
    # The same trajectory; val/rmse summed batch by batch (torchmetrics) vs over the whole split at once: float32
    # summation order alone, ~1e-7 relative per add over ~70 values. A wrong standardisation (or none) is O(1).
    assert template["val_metric"] == pytest.approx(reference["val_metric"], rel=1e-5)
