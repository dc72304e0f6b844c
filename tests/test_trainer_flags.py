"""Lightning's everyday Trainer flags and loggers on the template's recipe: each run finishes with its test scores,
or exits 2 with one sentence, and writes nothing outside its run directory under logs/."""

from pathlib import Path

import pytest
from conftest import DIGITS

from project.engine import main

pytestmark = [
    pytest.mark.slow,
    pytest.mark.guarantee(
        "Lightning's everyday flags (`fast_dev_run`, `overfit_batches`, no validation, no checkpointing, no "
        "logger, CSVLogger, `val_check_interval`, `max_time`, ...) run to their test scores inside one run "
        "directory under `logs/`, or are refused in one sentence"
    ),
]

# Short runs: 6 batches per epoch, 2 eval batches.
SHORT = ("--trainer.max_epochs=2", "--trainer.limit_train_batches=6", "--trainer.limit_val_batches=2",
         "--trainer.limit_test_batches=2", "--trainer.log_every_n_steps=2")  # fmt: skip

FINISHES = {
    "fast_dev_run": ("--trainer.fast_dev_run=true",),
    "overfit_batches": ("--trainer.overfit_batches=2",),
    "no-validation": ("--trainer.limit_val_batches=0",),
    "no-checkpointing": ("--trainer.enable_checkpointing=false",),
    "no-logger": ("--trainer.logger=false",),
    "no-progress-bar": ("--trainer.enable_progress_bar=false",),
    "csv-logger": ("--trainer.logger=lightning.pytorch.loggers.CSVLogger", "--trainer.logger.save_dir=logs",
                   "--trainer.logger.name=digits"),
    "val_check_interval-fraction": ("--trainer.val_check_interval=0.5",),
    "val_check_interval-int": ("--trainer.val_check_interval=3",),
    "check_val_every_n_epoch": ("--trainer.check_val_every_n_epoch=2",),
    "max_time": ("--trainer.max_time=00:00:10:00",),
    "max_steps-without-epochs": ("--trainer.max_epochs=null", "--trainer.max_steps=9"),
    "detect_anomaly": ("--trainer.detect_anomaly=true",),
    "profiler-simple": ("--trainer.profiler=simple",),
    "reload_dataloaders": ("--trainer.reload_dataloaders_every_n_epochs=1",),
    "no-sanity-check": ("--trainer.num_sanity_val_steps=0",),
    "two-workers": ("--data.num_workers=2",),
}  # fmt: skip


def _written(root: Path) -> list[Path]:
    return sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize("case", FINISHES)
def test_the_flag_runs_to_its_test_scores_inside_one_run_directory(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The test runs in tmp_path (conftest): logs/ below is the default save_dir, relative to the cwd.
    main(["fit", "--config", DIGITS, *SHORT, *FINISHES[case]])
    out = capsys.readouterr().out
    assert "test/acc=" in out and "test/loss=" in out, out[-2000:]
    written = _written(tmp_path)
    if case == "fast_dev_run":
        assert written == []  # Lightning's meaning: no logs, no checkpoints
        return
    assert written, "the run wrote nothing"
    run_dirs = {p.parts[:3] for p in written}
    assert len(run_dirs) == 1 and next(iter(run_dirs))[0] == "logs", written  # logs/<name>/version_<n>/...
    names = {p.name for p in written}
    assert "config.yaml" in names
    if case == "no-checkpointing":
        assert not any(p.suffix == ".ckpt" for p in written)
    else:
        assert "last.ckpt" in names
    if case == "no-validation":
        assert "best.ckpt" not in names and "Test of the final weights" in out
    if case == "csv-logger":
        metrics = (tmp_path / run_dirs.pop()[0]).rglob("metrics.csv")
        text = next(metrics).read_text()
        assert "train/loss" in text and "hp/test_acc" in text


REFUSED = {
    # 0.1 of 5 validation batches is less than one batch: Lightning's own MisconfigurationException.
    "limit_val_batches-too-small": (("--trainer.limit_val_batches=0.1",), "limit_val_batches"),
    "no-run-length": (("--trainer.max_epochs=null", "--trainer.max_steps=-1"), "trainer.max_epochs"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_a_flag_that_cannot_work_is_refused_in_one_sentence_and_leaves_nothing(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args, key = REFUSED[case]
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", DIGITS, *SHORT, *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ") and key in last and "Traceback" not in err, err[-2000:]
    assert _written(tmp_path) == []  # no half-made run directory


def test_resuming_a_run_without_checkpoints_is_refused_clearly(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    main(["fit", "--config", DIGITS, *SHORT, "--trainer.enable_checkpointing=false"])
    (run,) = (tmp_path / "logs" / "digits").iterdir()
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(run / "config.yaml"), f"--ckpt_path={run / 'checkpoints' / 'last.ckpt'}"])
    assert exit_info.value.code == 2
    assert "no such checkpoint file" in capsys.readouterr().err


def test_overfit_batches_trains_on_the_same_batches_every_epoch(
    tmp_path: Path, recwarn: pytest.WarningsRecorder
) -> None:
    from probes import Recorder

    from project.engine import CLI

    cli = CLI(["fit", "--config", DIGITS, *SHORT, "--trainer.overfit_batches=2", "--trainer.max_epochs=3",
               "--trainer.callbacks+=probes.Recorder"], run=True)  # fmt: skip
    recorder = next(cb for cb in cli.trainer.callbacks if isinstance(cb, Recorder))
    batches = recorder.batches()
    assert len(batches) == 6 and batches[0:2] == batches[2:4] == batches[4:6]
    # The DataModule's loader already reads in order: Lightning has no shuffling to turn off and warn about.
    assert not [str(w.message) for w in recwarn if "requested to overfit" in str(w.message)]


@pytest.mark.guarantee(
    "a step-based run shorter than an epoch validates at its `val_check_interval`s and at its last step; its "
    "schedule is `max_steps` long; best and last checkpoints are written"
)
@pytest.mark.parametrize(
    ("flags", "validated"),
    [
        # 20 batches per epoch; 7 steps: validations after steps 3, 6 and the last, 7 (the logger counts from 0).
        (("--trainer.max_epochs=null", "--trainer.max_steps=7"), [2, 5, 6]),
        # Validations counted in batches across epochs (check_val_every_n_epoch null): 2 epochs of 4 batches,
        # validations after 3 and 6, and at the end of the last epoch, 8.
        (("--trainer.max_epochs=2", "--trainer.limit_train_batches=4", "--trainer.check_val_every_n_epoch=null"),
         [2, 5, 7]),
    ],
    ids=["max_steps-mid-epoch", "intervals-across-epochs"],
)  # fmt: skip
def test_a_step_based_run_validates_at_its_last_step(
    flags: tuple[str, ...], validated: list[int], tmp_path: Path
) -> None:
    """Language models train by steps: a validation every val_check_interval batches, and max_steps with max_epochs
    null, or validations counted across epochs. Lightning validates at epoch ends and at those intervals, neither at
    max_steps mid-epoch nor, counting across epochs, at the end of the last epoch: the run must still validate its
    last step, so its best checkpoint and early stopping see it."""
    import torch
    from conftest import fit, scalars

    cli = fit(tmp_path, *flags, "--trainer.val_check_interval=3", "--trainer.limit_val_batches=2",
              "--trainer.limit_test_batches=2", "--trainer.log_every_n_steps=1")  # fmt: skip
    run = Path(cli.trainer.log_dir)
    steps = validated[-1] + 1
    assert cli.trainer.global_step == steps and cli.trainer.estimated_stepping_batches == steps  # the schedule's
    assert [step for step, _ in scalars(run)["val/acc"]] == validated
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == steps
    assert "test/acc" in cli.trainer.callback_metrics and cli.trainer.checkpoint_callback.best_model_path
