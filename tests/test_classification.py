"""The classification example (project/tasks/classification.py): its metrics against scikit-learn's
definitions, the metric a config names judges the run, and scikit-learn's balanced class weights."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import DIGITS, ROOT, fit, scalars

SHORT = ("--trainer.max_epochs=3", "--trainer.enable_progress_bar=false")

CLASSIFICATION = str(ROOT / "configs" / "tasks" / "classification.yaml")  # the shipped task, on the digits


@pytest.mark.guarantee(
    "`model.monitor` names the metric that judges a run (best checkpoint, early stopping, the sweep's objective, "
    "with the metric's own direction); the Classifier's metrics equal scikit-learn's definitions"
)
def test_the_classifiers_metrics_are_their_closed_forms_and_any_of_them_judges_the_run() -> None:
    """Each metric the Classifier offers equals scikit-learn's definition on the same scores (to float32 rounding:
    1e-6); ``model.monitor`` names the one that judges the run, with its own direction."""
    from sklearn import metrics as sk
    from sklearn.preprocessing import label_binarize

    from project.engine import ConfigError
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
    # One target (a table's real-valued column): said so, not torchmetrics' "num_classes ... larger than 1".
    with pytest.raises(ConfigError, match=re.escape("serves one target, ['price']: for real values train a regressor")):
        Classifier(net=torch.nn.Identity(), target_names=["price"])


@pytest.mark.guarantee(
    "`class_weights: balanced` weighs each sample's loss by scikit-learn's balanced weights from the training "
    "split's class counts, kept in the checkpoint; a class absent from the training split is refused",
)
def test_balanced_class_weights_are_scikit_learns_from_the_training_split() -> None:
    from types import SimpleNamespace

    import torch.nn.functional as F
    from sklearn.utils.class_weight import compute_class_weight

    from project.engine import ConfigError
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


@pytest.mark.guarantee(
    "`model.monitor` names the metric that judges a run (best checkpoint, early stopping, the sweep's objective, "
    "with the metric's own direction); the Classifier's metrics equal scikit-learn's definitions"
)
@pytest.mark.slow
def test_the_metric_named_in_the_config_picks_the_best_checkpoint_and_the_sweeps_metric(tmp_path: Path) -> None:
    from project.engine.sweep import spec as sweep_spec

    chosen = ("--model.metrics=[acc,balanced_acc]", "--model.monitor=val/balanced_acc")
    cli = fit(tmp_path, *chosen, *SHORT, configs=(DIGITS, CLASSIFICATION))
    checkpoint, stopper = cli.trainer.checkpoint_callback, cli.trainer.early_stopping_callback
    assert (checkpoint.monitor, checkpoint.mode, stopper.monitor, stopper.mode) == ("val/balanced_acc", "max") * 2
    logged = [v for _, v in scalars(Path(cli.trainer.log_dir))["val/balanced_acc"]]
    assert float(checkpoint.best_model_score) == pytest.approx(max(logged), rel=1e-6)
    path = tmp_path / "sweep.yaml"
    path.write_text(
        f"configs: [{DIGITS}, {CLASSIFICATION}]\nargs: {json.dumps(chosen)}\n"
        "params:\n  model.optimizer.init_args.lr: {low: 1.0e-3, high: 1.0e-2}\n"
    )
    spec = sweep_spec.load(path)
    sweep_spec.check_against_cli(spec)
    assert (spec.metric, spec.direction) == ("val/balanced_acc", "maximize")


def test_label_smoothing_outside_its_range_is_refused_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from project.engine import main

    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", DIGITS, "--config", CLASSIFICATION, "--model.label_smoothing=1.0",
              f"--trainer.logger.init_args.save_dir={tmp_path}"])  # fmt: skip
    assert exit_info.value.code == 2
    assert "model.label_smoothing=1.0: must lie in [0, 1)" in capsys.readouterr().err
