"""The divergence guard (observe/divergence.py, listed in the config's callbacks): a run whose loss, gradient
norm or evaluated loss turns non-finite stops in one sentence and saves nothing non-finite, or skips the step; it
reads its flag only where the run syncs anyway."""

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from conftest import DIGITS, HOST_SYNCS, ROOT, fit, offending_ops, run_ranks, scalars
from probes import InfGradient

from project.engine import main
from project.engine.observe.divergence import Diverged, DivergenceGuard

pytestmark = pytest.mark.slow
SHORT = ("--trainer.limit_train_batches=3", "--trainer.limit_val_batches=2", "--trainer.limit_test_batches=2",
         "--trainer.max_epochs=4")  # fmt: skip


def _finite(checkpoint: Path) -> bool:
    """Every tensor a checkpoint holds (weights, buffers, optimizer state) is finite."""
    state = torch.load(checkpoint, weights_only=True)
    tensors = [*state["state_dict"].values()]
    tensors += [t for opt in state["optimizer_states"] for s in opt["state"].values() for t in s.values()]
    return all(torch.isfinite(t).all() for t in tensors if isinstance(t, torch.Tensor) and t.is_floating_point())


def _only(tmp_path: Path, *callbacks: dict) -> str:
    """A config overlay whose callbacks are exactly these (the guard's own arguments among them)."""
    path = tmp_path / "callbacks.yaml"
    path.write_text(yaml.safe_dump({"trainer": {"callbacks": list(callbacks)}}))
    return str(path)


@pytest.mark.guarantee(
    "a run whose loss or gradient turns non-finite stops with exit 1 and one sentence naming the step, the value "
    "and the newest checkpoint; every checkpoint left holds finite values only, none written after the step"
)
def test_a_loss_that_turns_nan_stops_the_run_in_one_sentence_and_every_checkpoint_is_finite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The weights turn NaN as epoch 1 starts (steps 1-3 are epoch 0's): its first step, 4, has a NaN loss. The
    # logging step (10) is past the epoch's end: the validation after step 6 is where the guard reads it.
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--config", DIGITS, f"--trainer.logger.init_args.save_dir={tmp_path}", *SHORT,
              "--trainer.callbacks+=probes.PoisonWeights", "--trainer.callbacks.epoch=1"])  # fmt: skip
    err = capsys.readouterr().err
    assert exit_.value.code == 1 and "Traceback" not in err, err[-3000:]
    run = tmp_path / "digits" / "version_0"
    (said,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert said == (
        "error: the run diverged: the loss was nan at optimizer step 4; the newest checkpoint, "
        f"{run / 'checkpoints' / 'last.ckpt'}, was written before it (after step 3) and holds finite values only, "
        "and none was written after it. To go on, lower the learning rate or warm up longer, or let the "
        "DivergenceGuard callback skip such steps (action: skip)."
    )
    written = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert written == ["best.ckpt", "last.ckpt"]  # no temporary file left either
    for name in written:
        assert torch.load(run / "checkpoints" / name, weights_only=True)["global_step"] == 3
        assert _finite(run / "checkpoints" / name), name
    assert "test/loss" not in scalars(run)  # fit failed: the test after it did not run
    provenance = json.loads((run / "provenance.json").read_text())
    assert provenance["segments"][-1]["status"] == "diverged: the loss was nan at optimizer step 4"


@pytest.mark.guarantee(
    "a run whose loss or gradient turns non-finite stops with exit 1 and one sentence naming the step, the value "
    "and the newest checkpoint; every checkpoint left holds finite values only, none written after the step"
)
def test_a_gradient_that_turns_inf_stops_the_run_before_the_next_checkpoint(tmp_path: Path) -> None:
    # The gradient of step 7 holds an inf, its loss is finite: the weights it reaches are not, and step 8's loss is
    # NaN. A checkpoint every 4 steps: step 4's is written, step 8's (due before the logging step 10, where the guard
    # would read anyway) is not.
    every_4 = ("--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
               "--trainer.callbacks.every_n_train_steps=4", "--trainer.callbacks.save_top_k=-1",
               "--trainer.callbacks.filename=every-{step}")  # fmt: skip
    with pytest.raises(Diverged) as stop:
        fit(tmp_path, "--trainer.limit_train_batches=20", "--trainer.max_epochs=1", *every_4,
            "--trainer.callbacks+=probes.InfGradient", "--trainer.callbacks.steps=[6]")  # fmt: skip
    assert str(stop.value).startswith("the run diverged: the loss was nan at optimizer step 8; ")
    checkpoints = tmp_path / "digits" / "version_0" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["every-step=4.ckpt"]
    assert f"the newest checkpoint, {checkpoints / 'every-step=4.ckpt'}, was written before it (after step 4)" in str(
        stop.value
    )
    assert _finite(checkpoints / "every-step=4.ckpt")


@pytest.mark.guarantee(
    "`best.ckpt` is never chosen from a non-finite metric, whatever the monitored one: a non-finite `val/loss` stops "
    "the run at that validation, before the best checkpoint and early stopping see it"
)
def test_a_non_finite_evaluated_loss_stops_the_run_before_the_best_checkpoint_sees_it(tmp_path: Path) -> None:
    # BatchNorm's running statistics turn NaN at epoch 1's validation: training stays finite, val/loss does not,
    # val/acc (the monitored metric) does. best.ckpt stays epoch 0's.
    with pytest.raises(Diverged) as stop:
        fit(tmp_path, *SHORT, "--model.net=toy.BackboneNet", "--trainer.callbacks+=probes.PoisonBuffers")
    assert str(stop.value).startswith("the run diverged: val/loss was nan at the validation after step 6; ")
    best = tmp_path / "digits" / "version_0" / "checkpoints" / "best.ckpt"
    assert torch.load(best, weights_only=True)["global_step"] == 3 and _finite(best)


@pytest.mark.guarantee(
    "`action: skip`: a step with a non-finite gradient is not taken (the weights and the optimizer's state stay "
    "as they were), skips are logged as train/skipped_steps, and more than `max_skips_in_a_row` in a row stop the run"
)
def test_skip_drops_the_steps_with_non_finite_gradients_and_the_run_goes_on(tmp_path: Path) -> None:
    guard = {"class_path": "project.engine.DivergenceGuard", "init_args": {"action": "skip"}}
    probe = {"class_path": "probes.InfGradient", "init_args": {"steps": [5, 6]}}
    cli = fit(tmp_path, "--trainer.limit_train_batches=12", "--trainer.max_epochs=1", "--trainer.log_every_n_steps=4",
              configs=(DIGITS, _only(tmp_path, guard, probe)))  # fmt: skip
    probe_ = next(cb for cb in cli.trainer.callbacks if isinstance(cb, InfGradient))
    for step in (5, 6):  # nothing moved: the weights, and so what the next step starts from
        before, after = probe_.around[step]
        assert after and all(torch.equal(after[k], v) for k, v in before.items()), f"step {step} was taken"
    assert cli.trainer.global_step == 12  # the skipped steps still count, as under fp16's GradScaler
    adam = cli.trainer.optimizers[0].state[next(iter(cli.model.parameters()))]
    assert int(adam["step"]) == 12 - 2  # the optimizer's own state did not take them either
    assert all(torch.isfinite(p).all() for p in cli.model.parameters())
    assert scalars(tmp_path / "digits" / "version_0")["train/skipped_steps"] == [(3, 0.0), (7, 2.0), (11, 2.0)]

    # Three in a row, two allowed: the third stops the run.
    guard["init_args"]["max_skips_in_a_row"] = 2
    probe["init_args"]["steps"] = [5, 6, 7]
    with pytest.raises(Diverged) as stop:
        fit(tmp_path / "three", "--trainer.limit_train_batches=12", "--trainer.max_epochs=1",
            configs=(DIGITS, _only(tmp_path, guard, probe)))  # fmt: skip
    assert str(stop.value).startswith(
        "the run diverged: the gradient norm was inf at 3 optimizer steps in a row, the last step 8; "
    )


@pytest.mark.guarantee(
    "the divergence guard makes the host wait for nothing per step: it reads its flag only on the steps the logger "
    "writes (and at validations, checkpoints and the end)"
)
def test_the_guard_reads_back_nothing_on_the_steps_the_logger_does_not_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    read_at: list[int] = []  # the optimizer step under way when a guard's per-batch hook read a value back

    def counted(hook: Any) -> Any:
        def run(self: DivergenceGuard, trainer: Any, *args: Any) -> None:
            step = trainer.global_step + (hook.__name__ != "on_train_batch_end")  # the step it belongs to
            syncs = offending_ops(lambda func, *_: func.overloadpacket.__name__ in HOST_SYNCS,
                                  lambda: hook(self, trainer, *args))  # fmt: skip
            read_at.extend([step] if syncs else [])

        run.__name__ = hook.__name__
        return run

    for name in ("on_before_backward", "on_before_optimizer_step", "on_train_batch_end"):
        monkeypatch.setattr(DivergenceGuard, name, counted(getattr(DivergenceGuard, name)))
    cli = fit(tmp_path, "--trainer.limit_train_batches=12", "--trainer.max_epochs=1", "--trainer.log_every_n_steps=4",
              "--trainer.accumulate_grad_batches=2")  # fmt: skip
    assert cli.trainer.global_step == 6
    assert sorted(set(read_at)) == [4]  # the one logging step of 6 (2 micro-batches each): once, there


@pytest.mark.guarantee("Lightning's SpikeDetection, listed by a user, ends the run in one sentence, not a traceback")
def test_lightnings_spike_detection_ends_the_run_in_one_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--config", DIGITS, f"--trainer.logger.init_args.save_dir={tmp_path}", *SHORT,
              "--trainer.callbacks+=lightning.pytorch.callbacks.SpikeDetection",
              "--trainer.callbacks+=probes.PoisonWeights", "--trainer.callbacks.epoch=1"])  # fmt: skip
    err = capsys.readouterr().err
    assert exit_.value.code == 1 and "Traceback" not in err, err[-3000:]
    (said,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert said.startswith("error: the run stopped on a loss spike (Lightning's SpikeDetection: Training spike")


@pytest.mark.guarantee("every process of a DDP run takes the guard's decision at the same step, whichever saw it")
@pytest.mark.engine
def test_a_non_finite_value_on_one_process_stops_every_process_at_the_same_step(tmp_path: Path) -> None:
    # Rank 1 alone sees a NaN loss at step 3 (0-based: the 4th); the logging step is 5. Both ranks stop there, rank 0
    # says why, and neither saves anything after it.
    done = run_ranks("fit", "--config", DIGITS, "--config", str(ROOT / "configs" / "ddp.yaml"),
                     f"--trainer.logger.init_args.save_dir={tmp_path}", "--trainer.limit_train_batches=8",
                     "--trainer.max_epochs=1", "--trainer.log_every_n_steps=5", "--trainer.accelerator=cpu",
                     "--trainer.callbacks+=probes.NonFiniteOnOneRank", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 1, done.stdout[-3000:]
    assert "Traceback" not in done.stdout
    said = [line for line in done.stdout.splitlines() if line.startswith("error:")]
    assert said == [
        "error: the run diverged: another process saw a non-finite value; no checkpoint was written. To go on, lower "
        "the learning rate or warm up longer, or let the DivergenceGuard callback skip such steps (action: skip)."
    ]
    assert not list(tmp_path.rglob("*.ckpt"))
    (provenance,) = tmp_path.rglob("provenance.json")
    ended = json.loads(provenance.read_text())["segments"][-1]
    assert ended["status"] == "diverged: another process saw a non-finite value" and ended["steps"] == 5
