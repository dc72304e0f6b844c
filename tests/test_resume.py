"""A resumed run equals the uninterrupted one, bit for bit: weights, LR at every step, logged losses."""

import signal
from pathlib import Path

import pytest
import torch
import yaml
from conftest import DIGITS, ROOT, fit, scalars
from probes import Crash

from project.engine.checkpointing.last_checkpoint import Interrupted

EPOCHS, BATCHES = 3, 10  # 30 optimizer steps
FP16_CPU = str(ROOT / "tests" / "configs" / "fp16_cpu.yaml")
RUN = ("--trainer.max_epochs=3", "--trainer.limit_train_batches=10", "--trainer.limit_val_batches=2",
       "--trainer.limit_test_batches=2", "--trainer.log_every_n_steps=1")  # fmt: skip


def _overlay(tmp_path: Path, every_n_train_steps: int | None, crash: dict | None, workers: int) -> str:
    """Callbacks as in tests/configs/digits.yaml, last.ckpt every N steps (or per epoch), plus an optional crash."""
    callbacks = yaml.safe_load(Path(DIGITS).read_text())["trainer"]["callbacks"]
    for cb in callbacks:
        if cb["class_path"].endswith("LastCheckpoint"):
            cb["init_args"]["every_n_train_steps"] = every_n_train_steps
    if crash:
        callbacks.append({"class_path": "probes.CrashAt", "init_args": crash})
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / f"overlay-{len(list(tmp_path.glob('overlay-*')))}.yaml"
    path.write_text(yaml.safe_dump({"trainer": {"callbacks": callbacks}, "data": {"num_workers": workers}}))
    return str(path)


def _final_weights(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


def _interrupted_then_resumed(
    tmp_path: Path, every: int | None, crash: dict, workers: int, flags: tuple[str, ...] = ()
) -> Path:
    run = tmp_path / "digits" / "version_0"
    with pytest.raises((Crash, Interrupted)):
        fit(tmp_path, *RUN, *flags, configs=(DIGITS, _overlay(tmp_path, every, crash, workers)))
    assert (run / "checkpoints" / "last.ckpt").is_file()
    # The resumed process: the run's own saved config, its last.ckpt (what `make resume` runs), without the crash.
    callbacks = yaml.safe_load((run / "config.yaml").read_text())["trainer"]["callbacks"]
    uncrashed = tmp_path / "uncrashed.yaml"
    uncrashed.write_text(yaml.safe_dump({"trainer": {"callbacks": [
        cb for cb in callbacks if not cb["class_path"].endswith("CrashAt")]}}))  # fmt: skip
    last = str(run / "checkpoints" / "last.ckpt")
    resumed = fit(tmp_path, "--ckpt_path", last, configs=(str(run / "config.yaml"), str(uncrashed)))
    assert resumed.trainer.global_step == EPOCHS * BATCHES
    assert [d.name for d in (tmp_path / "digits").iterdir()] == ["version_0"]  # no second run
    return run


FROZEN_FOR_AN_EPOCH = ("--model.net=toy.BackboneNet", "--model.freeze_backbone=1",
                       "--model.backbone_lr_scale=0.1")  # fmt: skip
SGD_LINEAR = ("--model.optimizer=SGD", "--model.optimizer.momentum=0.9", "--model.optimizer.nesterov=true",
              "--model.schedule=project.recipe.WarmupLinear")  # fmt: skip
# A closure optimizer (several forward and backward passes per step, its curvature history in the checkpoint), on
# one parameter group: LBFGS takes no other.
LBFGS = ("--model.optimizer=torch.optim.LBFGS", "--model.optimizer.lr=0.5", "--model.param_groups=null",
         "--model.net=toy.MLP")  # fmt: skip
EMA = ("--trainer.callbacks+=project.engine.EMA", "--trainer.callbacks.decay=0.9")
CASES: dict[str, tuple[int | None, dict, int, tuple[str, ...]]] = {
    "epoch-boundary": (None, {"epoch": 1}, 0, ()),  # crash as epoch 1 starts: resume from the end of epoch 0
    "mid-epoch": (4, {"step": 15}, 0, ()),  # crash at step 15: resume from the step-12 checkpoint (mid epoch 1)
    "mid-epoch-2-workers": (4, {"step": 15}, 2, ()),
    "sigint": (None, {"step": 14, "signal": int(signal.SIGINT)}, 0, ()),  # Ctrl-C: saved at the next step boundary
    "sigterm-2-workers": (None, {"step": 23, "signal": int(signal.SIGTERM)}, 2, ()),
    # Ctrl-C during an epoch's last batch: saved after that epoch's validation, as at an epoch end
    "sigint-last-batch": (4, {"step": 19, "signal": int(signal.SIGINT)}, 0, ()),
    # An augmentation drawing from NumPy's and Python's global RNGs in the training process: both come back.
    "mid-epoch-numpy-python-rng": (4, {"step": 15}, 0, ("--data=probes.JitteredDigits",)),
    # float64 weights: Lightning restores them before converting the module to float64, which rounded them
    # through float32 (~1e-8 off after the resume) until the task converts first.
    "sigint-float64": (None, {"step": 14, "signal": int(signal.SIGINT)}, 0, ("--trainer.precision=64-true",)),
    # float16 autocast with a GradScaler whose scale grows every 2 steps: its state must come back with the run.
    # The MLP: float16 convolutions are slow on a CPU (20 s for this case with the ConvNet).
    "sigint-fp16-loss-scaling": (
        None,
        {"step": 14, "signal": int(signal.SIGINT)},
        0,
        ("--config", FP16_CPU, "--model.net=toy.MLP"),
    ),
    # A ResNet whose backbone is frozen in epoch 0 (BatchNorm too) and at a tenth of the LR: killed as epoch 1
    # starts, the resumed process unfreezes it, with the optimizer's groups and the schedule of the straight run.
    "across-the-unfreeze-epoch": (None, {"epoch": 1}, 0, FROZEN_FOR_AN_EPOCH),
    # The recipe by config: SGD with Nesterov momentum (its buffers come back) and a linear decay; AdamW with WSD.
    "mid-epoch-sgd-linear": (4, {"step": 15}, 0, SGD_LINEAR),
    "mid-epoch-lbfgs": (4, {"step": 15}, 0, LBFGS),
    # An EMA of the weights: the average and the raw weights both come back (validation evaluates the average).
    "mid-epoch-ema": (4, {"step": 15}, 0, EMA),
    "sigint-wsd": (
        None,
        {"step": 26, "signal": int(signal.SIGINT)},
        0,
        ("--model.schedule=project.recipe.WarmupStableDecay",),
    ),
}


@pytest.mark.engine
@pytest.mark.guarantee(
    "a resumed run ends bitwise equal to the uninterrupted one (weights, LR and losses per step): epoch boundary, "
    "mid-epoch with 0/2 workers, mid-epoch with an augmentation drawing from NumPy's and Python's RNGs, Ctrl-C, "
    "SIGTERM, float16 loss scaling on the CPU (the GradScaler's scale and growth tracker too), float64 weights "
    "(which Lightning restores before converting the module, rounding them through float32, unless the task "
    "converts first)"
)
@pytest.mark.guarantee(
    "a run killed before the unfreeze epoch resumes bitwise equal to the uninterrupted one (weights, every group's "
    "LR, losses)"
)
@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_resumed_run_equals_the_uninterrupted_one(case: str, tmp_path: Path) -> None:
    every, crash, workers, flags = CASES[case]
    straight = tmp_path / "straight"
    fit(straight, *RUN, *flags, configs=(DIGITS, _overlay(tmp_path, every, None, workers)))
    resumed = _interrupted_then_resumed(tmp_path / "resumed", every, crash, workers, flags)

    expected, got = _final_weights(straight / "digits" / "version_0"), _final_weights(resumed)
    straight_last = torch.load(straight / "digits" / "version_0" / "checkpoints" / "last.ckpt", weights_only=True)
    resumed_last = torch.load(resumed / "checkpoints" / "last.ckpt", weights_only=True)
    if "MixedPrecision" in straight_last:  # the scaler's scale and growth tracker, as if never interrupted
        assert straight_last["MixedPrecision"]["scale"] > 1024.0  # it grew: a fresh scaler would differ
        assert resumed_last["MixedPrecision"] == straight_last["MixedPrecision"]
    for name, value in expected.items():
        assert torch.equal(got[name], value), f"{name} differs after resuming ({case})"
    for name, value in straight_last.get("current_model_state", {}).items():  # an EMA's raw weights
        assert torch.equal(resumed_last["current_model_state"][name], value), f"raw {name} differs ({case})"
    a, b = scalars(straight / "digits" / "version_0"), scalars(resumed)
    lrs = [tag for tag in a if tag.startswith("lr-")]  # decay, no_decay, or a backbone's and head's groups
    assert len(lrs) == (4 if "--model.freeze_backbone=1" in flags else 1 if "--model.param_groups=null" in flags else 2)
    for tag in ("train/loss", *lrs, "val/loss", "val/acc"):
        assert b[tag] == a[tag], f"{tag} differs ({case})"  # same steps, no duplicates, bitwise equal values
    assert [s for s, _ in a["train/loss"]] == list(range(EPOCHS * BATCHES))


@pytest.mark.guarantee(
    "`--callback.LastCheckpoint.every_n_train_steps=N` writes last.ckpt every N optimizer steps, mid-epoch, without "
    "restating the callbacks, and the run's config.yaml holds it for the resume"
)
def test_the_checkpoint_interval_is_one_key(tmp_path: Path) -> None:
    # Crashed at step 7 of epoch 0: only a mid-epoch save leaves a last.ckpt, the newest at step 6.
    crash = _overlay(tmp_path, None, {"step": 7}, 0)
    with pytest.raises(Crash):
        fit(tmp_path / "every", *RUN, "--callback.LastCheckpoint.every_n_train_steps=3", configs=(DIGITS, crash))
    run = tmp_path / "every" / "digits" / "version_0"
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 6
    saved = yaml.safe_load((run / "config.yaml").read_text())["trainer"]["callbacks"]
    (last,) = [cb for cb in saved if cb["class_path"].endswith("LastCheckpoint")]
    assert last["init_args"]["every_n_train_steps"] == 3  # what `make resume` reads
    with pytest.raises(Crash):
        fit(tmp_path / "never", *RUN, configs=(DIGITS, crash))
    assert not (tmp_path / "never" / "digits" / "version_0" / "checkpoints" / "last.ckpt").exists()


@pytest.mark.engine
@pytest.mark.guarantee(
    "a run resumed to train longer follows, from the resume on, the LR closed form of a run planned for the new length"
)
@pytest.mark.slow
def test_a_run_resumed_to_train_longer_follows_the_schedule_of_its_new_length(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from conftest import warmup_cosine
    from probes import Recorder

    from project.engine import resolve_warmup_steps

    short = ("--trainer.max_epochs=2", "--trainer.limit_train_batches=10", "--trainer.limit_val_batches=2",
             "--trainer.limit_test_batches=2")  # fmt: skip
    fit(tmp_path, *short)  # 20 optimizer steps, its cosine ends at min_lr on step 19
    run = tmp_path / "digits" / "version_0"
    resumed = fit(tmp_path, "--ckpt_path", str(run / "checkpoints" / "last.ckpt"), "--trainer.max_epochs=4",
                  "--trainer.callbacks+=probes.Recorder", configs=(str(run / "config.yaml"),))  # fmt: skip
    assert resumed.trainer.global_step == 40
    assert "the LR schedule is re-planned from 20 to 40 optimizer steps" in caplog.text  # Lightning's INFO log
    # Steps 20..39 use the LR a run planned for 40 steps from the start uses there, for each param group (both
    # start from the optimizer's lr): the same closed form, so equal to float rounding of the same arithmetic.
    recorder = next(cb for cb in resumed.trainer.callbacks if isinstance(cb, Recorder))
    hp = resumed.model.hparams
    warmup = resolve_warmup_steps(hp["warmup"], 40)
    peak, min_lr = hp["optimizer"]["init_args"]["lr"], hp["schedule"]["init_args"]["min_lr"]
    expected = [warmup_cosine(step, peak, min_lr, warmup, 40) for step in range(20, 40)]
    assert [lrs[0] for lrs in recorder.lrs] == pytest.approx(expected, rel=1e-12)
    assert [lrs[1] for lrs in recorder.lrs] == pytest.approx(expected, rel=1e-12)
    assert recorder.lrs[0][0] > 10 * min_lr  # not left at the old plan's end


@pytest.mark.guarantee(
    "last.ckpt is never written inside an accumulation window: Ctrl-C during a window's first micro-batch saves "
    "at the window's end, and the resumed run ends bitwise equal to the uninterrupted one"
)
@pytest.mark.slow
def test_ctrl_c_inside_an_accumulation_window_saves_at_its_end_and_resumes_exactly(tmp_path: Path) -> None:
    # 10 batches of an epoch in windows of 3 (3, 3, 3 and a short 1): 4 optimizer steps per epoch, 12 in all. The
    # signal arrives as step 5's window starts (epoch 1's second window, mid-epoch): a save after its first
    # micro-batch would hold a third of its gradient nowhere, and the resumed run would step on the other two alone.
    flags = ("--trainer.accumulate_grad_batches=3",)
    straight = tmp_path / "straight"
    fit(straight, *RUN, *flags, configs=(DIGITS, _overlay(tmp_path, None, None, 0)))
    run = tmp_path / "resumed" / "digits" / "version_0"
    crash = {"step": 5, "signal": int(signal.SIGINT)}
    with pytest.raises(Interrupted) as interrupted:
        fit(tmp_path / "resumed", *RUN, *flags, configs=(DIGITS, _overlay(tmp_path, None, crash, 0)))
    saved = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert interrupted.value.step == saved["global_step"] == 6  # at the end of step 5's window, not inside it
    fit(tmp_path / "resumed", "--ckpt_path", str(run / "checkpoints" / "last.ckpt"),
        configs=(str(run / "config.yaml"),))  # fmt: skip
    expected, got = _final_weights(straight / "digits" / "version_0"), _final_weights(run)
    for name, value in expected.items():
        assert torch.equal(got[name], value), f"{name} differs after resuming"
    assert scalars(run)["train/loss"] == scalars(straight / "digits" / "version_0")["train/loss"]
