"""Training mechanics, each compared with a closed form or a reference computation (one process, CPU, fp32)."""

import copy
import gc
import math
import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
import yaml
from conftest import DIGITS, PYTHONPATH, fit, scalars, warmup_cosine
from lightning.pytorch.plugins import MixedPrecision
from lightning.pytorch.utilities.model_summary import get_human_readable_count, summarize
from probes import InfGradAt, Recorder
from toy import Classifier, ConvNet, Digits

from project.engine import CLI, planned_steps

PEAK, MIN_LR = 3e-3, 1e-5  # model.optimizer's lr and model.schedule's min_lr in tests/configs/digits.yaml


def expected_lr(step: int, warmup: int, total: int, peak: float = PEAK, min_lr: float = MIN_LR) -> float:
    return warmup_cosine(step, peak, min_lr, warmup, total)


def recorder_of(cli: CLI) -> Recorder:
    return next(cb for cb in cli.trainer.callbacks if isinstance(cb, Recorder))


SHORT = ("--trainer.limit_val_batches=1", "--trainer.limit_test_batches=1", "--trainer.callbacks+=probes.Recorder")


@pytest.mark.guarantee(
    "the LR used at every optimizer step is the warmup+cosine closed form (warmup as fraction and count, with "
    "accumulation, with `max_steps`), bitwise the default's; warmup+linear, constant after warmup and "
    "warmup-stable-decay (linear, 1-sqrt, cosine) follow theirs, each group scaled, each re-planned on a resume of "
    "another length"
)
@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "total", "warmup"),
    [
        # 3 epochs x 7 batches; warmup as a fraction of the run, rounded up: ceil(0.3 * 21) = 7
        (["--trainer.max_epochs=3", "--trainer.limit_train_batches=7", "--model.warmup=0.3"], 21, 7),
        # warmup as a count
        (["--trainer.max_epochs=3", "--trainer.limit_train_batches=7", "--model.warmup=4"], 21, 4),
        # accumulation: 10 batches per epoch in windows of 4 -> 3 optimizer steps per epoch, 6 in all
        (["--trainer.max_epochs=2", "--trainer.limit_train_batches=10", "--trainer.accumulate_grad_batches=4",
          "--model.warmup=2"], 6, 2),
        # max_steps instead of max_epochs; the run crosses an epoch boundary (7 batches per epoch)
        (["--trainer.max_epochs=null", "--trainer.max_steps=13", "--trainer.limit_train_batches=7",
          "--model.warmup=0.2"], 13, 3),
    ],
    ids=["warmup-fraction", "warmup-count", "accumulate-4", "max-steps"],
)  # fmt: skip
def test_lr_used_at_every_optimizer_step_is_the_closed_form(
    args: list[str], total: int, warmup: int, tmp_path: Path
) -> None:
    cli = fit(tmp_path, *args, *SHORT)
    lrs = recorder_of(cli).lrs
    assert cli.trainer.global_step == total
    trainer = cli.trainer  # the notebooks' planned_steps agrees with Lightning's own estimate
    assert (
        total
        == trainer.estimated_stepping_batches
        == planned_steps(
            int(trainer.num_training_batches),
            trainer.accumulate_grad_batches,
            trainer.max_epochs or -1,
            trainer.max_steps,
        )
    )
    assert len(lrs) == total
    for step, groups in enumerate(lrs):
        for lr in groups:  # both param groups (decay / no decay) follow the same curve
            assert lr == pytest.approx(expected_lr(step, warmup, total), rel=1e-9), f"step {step}"
    assert lrs[-1][0] == pytest.approx(MIN_LR, rel=1e-9)


def _linear(step: int, warmup: int, total: int, floor: float = 1e-4) -> float:
    return (
        PEAK * (step + 1) / warmup
        if step < warmup
        else floor + (PEAK - floor) * (1 - (step - warmup) / (total - 1 - warmup))
    )


def _wsd_linear(step: int, warmup: int, total: int, floor: float = 1e-4) -> float:
    # decay_fraction 0.25 of 14 steps: ceil(3.5) = 4 steps below the peak (10..13), the floor at step 13.
    return (
        PEAK * (step + 1) / warmup
        if step < warmup
        else PEAK
        if step <= 9
        else floor + (PEAK - floor) * (1 - (step - 9) / 4)
    )


RECIPES = {
    "sgd-nesterov-linear": (("--model.optimizer=SGD", "--model.optimizer.momentum=0.9",
                             "--model.optimizer.nesterov=true", "--model.schedule=project.recipe.WarmupLinear",
                             "--model.schedule.min_lr=1e-4"), torch.optim.SGD, _linear),
    "adamw-wsd": (("--model.schedule=project.recipe.WarmupStableDecay", "--model.schedule.min_lr=1e-4",
                   "--model.schedule.decay_fraction=0.25", "--model.schedule.shape=linear"), torch.optim.AdamW,
                  _wsd_linear),
    "your-own-schedule": (("--model.schedule=toy.HalvingSchedule", "--model.schedule.every=4"), torch.optim.AdamW,
                          lambda step, warmup, total: PEAK * 0.5 ** (step // 4)),
}  # fmt: skip
# Another imported library's optimizer named SGD (bitsandbytes has one, and peft imports it where it is installed):
# the bare name on the command line stays torch.optim's.
RECIPES["sgd-beside-another-librarys-sgd"] = RECIPES["sgd-nesterov-linear"]


@pytest.mark.guarantee(
    "the engine stands alone: a run whose config names no class of project/recipe.py never imports it, so an owner's "
    "rewrite of that file cannot break the engine"
)
@pytest.mark.slow
def test_the_engine_trains_without_the_recipe_file(tmp_path: Path) -> None:
    # project.recipe made unimportable (None in sys.modules): the tests' config names its own rule and schedule.
    script = (
        "import sys; sys.modules['project.recipe'] = None\n"
        "from project.engine import main\n"
        f"main(['fit', '--config', {DIGITS!r}, '--trainer.fast_dev_run=true', "
        f"'--trainer.logger.init_args.save_dir={tmp_path}'])\n"
        "assert 'project.recipe' not in [m for m, v in sys.modules.items() if v is not None]\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "PYTHONPATH": PYTHONPATH}
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.guarantee(
    "the optimizer and the schedule are the config's (`model.optimizer`: any `torch.optim` class with its own "
    "arguments, by a bare name even where another imported library has an optimizer of that name; "
    "`model.schedule`: a shipped one or the user's own class), over the weight-decay split, every step at the "
    "schedule's closed form"
)
@pytest.mark.parametrize("recipe", RECIPES)
def test_the_optimizer_and_schedule_are_the_configs(recipe: str, tmp_path: Path) -> None:
    # By config lines alone: the optimizer of that class with its own arguments over the weight-decay split, and
    # every optimizer step at the schedule's closed form (2 epochs x 7 batches = 14 steps, 2 of warmup).
    args, kind, closed_form = RECIPES[recipe]
    rival = type("SGD", (torch.optim.SGD,), {"__module__": __name__}) if "another" in recipe else None
    cli = fit(tmp_path, *args, "--trainer.max_epochs=2", "--trainer.limit_train_batches=7", "--model.warmup=2", *SHORT)
    del rival  # gone from SGD's subclasses once collected: no other test sees it
    gc.collect()
    optimizer = cli.trainer.optimizers[0]
    assert type(optimizer) is kind and optimizer.defaults["lr"] == PEAK
    if kind is torch.optim.SGD:
        assert optimizer.defaults["momentum"] == 0.9 and optimizer.defaults["nesterov"] is True
    decay, no_decay = optimizer.param_groups
    assert decay["weight_decay"] == 0.05 and no_decay["weight_decay"] == 0.0  # the optimizer's, and none
    lrs = recorder_of(cli).lrs
    assert len(lrs) == 14
    for step, groups in enumerate(lrs):
        assert groups == pytest.approx([closed_form(step, 2, 14)] * 2, rel=1e-12), f"step {step}"


@pytest.mark.guarantee(
    "each evaluation batch's outputs and targets reach the callbacks (`on_validation_batch_end`, "
    "`on_test_batch_end`) from the step itself, no second forward pass"
)
def test_each_evaluation_batchs_outputs_and_targets_reach_the_callbacks(tmp_path: Path) -> None:
    # A callback that needs the predictions (a confusion matrix, the worst examples) gets them from the step itself.
    cli = fit(tmp_path, "--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=3",
              "--trainer.limit_test_batches=2", "--trainer.num_sanity_val_steps=0",
              "--trainer.callbacks+=probes.EvalOutputs")  # fmt: skip
    probe = next(cb for cb in cli.trainer.callbacks if type(cb).__name__ == "EvalOutputs")
    assert probe.seen == [("val", True, True)] * 3 + [("test", True, True)] * 2


def test_lightnings_model_summary_counts_the_flops_of_one_input(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    # Lightning's summary counts FLOPs by forwarding the task's example_input_array (0 without one). The closed form
    # for an MLP: 2 x inputs x outputs per linear layer and sample (FlopCounterMode counts a multiply-add as 2).
    hidden = 16
    cli = fit(tmp_path, "--model.net=toy.MLP", f"--model.net.hidden={hidden}", "--trainer.max_steps=2",
              "--trainer.limit_val_batches=1", "--trainer.limit_test_batches=1")  # fmt: skip
    features, classes = math.prod(cli.datamodule.input_shape), len(cli.datamodule.target_names)
    closed_form = 2 * (features * hidden + hidden * classes)
    assert cli.model.example_input_array.shape == (1, *cli.datamodule.input_shape)
    assert summarize(cli.model).total_flops == closed_form
    assert f"Total FLOPs: {get_human_readable_count(closed_form)}" in capfd.readouterr().out


def test_a_datamodule_hook_that_unpacks_inputs_and_targets_gets_no_example_input(tmp_path: Path) -> None:
    # Lightning's summary passes the example input alone through on_after_batch_transfer: a DataModule whose own
    # hook unpacks (inputs, targets), as a GPU augmentation there would, must train as before, without one.
    cli = fit(tmp_path, "--data=probes.UnpackingDigits", "--trainer.max_steps=2", "--trainer.limit_val_batches=1",
              "--trainer.limit_test_batches=1")  # fmt: skip
    assert cli.trainer.global_step == 2 and cli.model.example_input_array is None


def _accumulation_run(tmp_path: Path, batch_size: int, accumulate: int) -> Recorder:
    cli = fit(
        tmp_path,
        f"--data.batch_size={batch_size}",
        f"--trainer.accumulate_grad_batches={accumulate}",
        "--trainer.max_epochs=1",
        "--trainer.precision=64-true",
        "--model.net.init_args.dropout=0.0",
        *SHORT,
        "--trainer.callbacks.keep_grads=true",
    )
    return recorder_of(cli)


@pytest.mark.guarantee(
    "accumulation of k batches of B = one batch of kB: the gradient of every step, the short last window included, "
    "and the final weights, in float64 to 1e-10 (the runs differ only in summation order)"
)
@pytest.mark.slow
def test_accumulation_equals_the_large_batch_including_the_partial_last_window(tmp_path: Path) -> None:
    # 1257 training samples: batch 3 gives 419 micro-batches = 104 windows of 4 + a last window of 3;
    # batch 12 gives the same samples in the same order: 104 batches of 12 + a last one of 9 = 3 x 3.
    small = _accumulation_run(tmp_path / "small", batch_size=3, accumulate=4)
    large = _accumulation_run(tmp_path / "large", batch_size=12, accumulate=1)
    assert small.batch_sizes[-3:] == [3, 3, 3] and len(small.batch_sizes) == 419
    assert large.batch_sizes[-1] == 9 and len(large.batch_sizes) == 105
    flat_small = [i for b in small.batches() for i in b]
    assert flat_small == [i for b in large.batches() for i in b]
    assert len(small.grads) == len(large.grads) == 105
    assert small.grads[0].dtype == torch.float64
    # The two runs are equal in exact arithmetic at every step; only the summation order differs (4 means of 3
    # vs one mean of 12). They run in float64 so that this rounding cannot grow into a visible trajectory
    # difference: in float32 (unit roundoff 6e-8) the weights drifted ~2.5e-6 apart over these 105 AdamW steps,
    # i.e. the run amplifies rounding ~40x; float64's 1.1e-16 gives ~5e-15 (measured: 2e-14 on weights, 5e-16
    # on gradients), and the bounds below leave a factor > 10^3 for other kernels. The bug it guards, a tail
    # step with 3/4 of its gradient, moves weights by ~1e-4: six orders of magnitude above the bound.
    for step, (g_small, g_large) in enumerate(zip(small.grads, large.grads, strict=True)):
        torch.testing.assert_close(g_small, g_large, rtol=1e-9, atol=1e-11, msg=f"gradient of step {step}")
    for name, value in large.final_state.items():
        torch.testing.assert_close(small.final_state[name], value, rtol=0, atol=1e-10, msg=name)
    # The bound bites: the uncorrected tail (3/4 of the gradient) is far outside it.
    with pytest.raises(AssertionError):
        torch.testing.assert_close(small.grads[-1] * 0.75, large.grads[-1], rtol=1e-9, atol=1e-11)


@pytest.mark.guarantee("`train/grad_norm` is the true pre-clip norm, logged on logging steps only")
@pytest.mark.slow
def test_grad_norm_is_logged_on_logging_steps_only_with_the_true_value(tmp_path: Path) -> None:
    cli = fit(tmp_path, "--trainer.max_epochs=1", "--trainer.log_every_n_steps=3", *SHORT)
    recorded = recorder_of(cli).grad_norms
    logged = dict(scalars(tmp_path / "digits" / "version_0")["train/grad_norm"])
    assert sorted(logged) == [s for s in range(len(recorded)) if (s + 1) % 3 == 0]
    for step, value in logged.items():
        assert value == pytest.approx(recorded[step], rel=1e-5)


class PostStepGradNorm(L.Callback):
    """The gradient norm the optimizer step actually used (after unscaling and clipping)."""

    def __init__(self) -> None:
        self.norms: list[float] = []

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *_: object) -> None:
        self.norms.append(torch.cat([p.grad.flatten() for p in pl_module.parameters()]).norm().item())


def _fp16_scaled_fit(clip: float | None, *extra: L.Callback) -> tuple[Recorder, PostStepGradNorm, L.Trainer, float]:
    """5 steps of fp16 autocast with a GradScaler (on CPU, through an explicit plugin: Lightning's "16-mixed"
    flag turns into bf16 on CPU); returns the fp32 reference norm of the first step's gradient too."""
    L.seed_everything(0)
    model = Classifier(net=ConvNet((1, 8, 8), 10, dropout=0.0), target_names=[str(d) for d in range(10)])
    dm = Digits(batch_size=64)
    dm.setup("fit")
    x, y = next(iter(dm.train_dataloader()))
    reference = copy.deepcopy(model)
    F.cross_entropy(reference(x), y).backward()
    true_norm = torch.cat([p.grad.flatten() for p in reference.parameters()]).norm().item()

    recorder, post = Recorder(), PostStepGradNorm()
    precision = MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu", init_scale=2.0**14))
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=5,
        plugins=[precision],
        gradient_clip_val=clip,
        callbacks=[recorder, post, *extra],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        use_distributed_sampler=False,
    )
    trainer.fit(model, datamodule=dm)
    return recorder, post, trainer, true_norm


@pytest.mark.guarantee(
    "under loss scaling, clipping bounds the true gradient norm; without clipping gradients are untouched",
)
@pytest.mark.slow
def test_clipping_under_fp16_loss_scaling_acts_on_true_gradients() -> None:
    clip = 0.05
    recorder, post, trainer, true_norm = _fp16_scaled_fit(clip)
    scaler = trainer.precision_plugin.scaler
    assert scaler is not None and scaler.get_scale() >= 2.0**13  # the loss really was scaled
    # The norm seen before clipping is in true units: the fp32 gradient of the same batch, not 2^14 times it.
    assert recorder.grad_norms[0] == pytest.approx(true_norm, rel=2e-2)
    assert all(n > clip for n in recorder.grad_norms)  # so clipping was active at every step
    assert post.norms == pytest.approx([clip] * 5, rel=1e-3)  # clipped to the bound, in true units
    # No foreach/fused conflict: the optimizer is not fused (fused AdamW + AMP clipping raises, #21435).
    assert not trainer.optimizers[0].defaults.get("fused")

    recorder, post, _, _ = _fp16_scaled_fit(None)
    assert post.norms == pytest.approx(recorder.grad_norms, rel=1e-6)  # without clipping: untouched


@pytest.mark.guarantee(
    "under loss scaling, a step with inf gradients is skipped and the scale backs off",
)
@pytest.mark.slow
def test_a_step_with_inf_gradients_is_skipped_under_loss_scaling() -> None:
    probe = InfGradAt(step=2)
    _, _, trainer, _ = _fp16_scaled_fit(1.0, probe)
    assert probe.before and probe.after
    for name, value in probe.before.items():
        assert torch.equal(probe.after[name], value), f"{name} changed in a step with inf gradients"
    assert probe.scales[1] == probe.scales[0] * 0.5  # GradScaler's backoff_factor
    assert trainer.global_step == 5  # the skipped step still counts (Lightning #18828: so does the LR schedule)


@pytest.mark.guarantee(
    "`32-true`, `bf16-mixed`, `16-mixed`, `bf16-true` each learn (train loss halves in 30 steps)",
)
@pytest.mark.slow
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed", "16-mixed", "bf16-true"])
def test_each_precision_learns_on_cpu(precision: str, tmp_path: Path) -> None:
    cli = fit(
        tmp_path,
        f"--trainer.precision={precision}",
        "--trainer.max_epochs=3",
        "--trainer.limit_train_batches=10",
        "--trainer.log_every_n_steps=1",
        "--trainer.limit_val_batches=1",
        "--trainer.limit_test_batches=1",
    )
    # On CPU Lightning runs "16-mixed" as "bf16-mixed" (no float16 autocast there); on CUDA it is fp16 + GradScaler.
    assert cli.trainer.precision == ("bf16-mixed" if precision == "16-mixed" else precision)
    weight_dtype = next(cli.model.parameters()).dtype
    assert weight_dtype == (torch.bfloat16 if precision == "bf16-true" else torch.float32)
    losses = [v for _, v in scalars(tmp_path / "digits" / "version_0")["train/loss"]]
    assert len(losses) == 30
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert last < 0.5 * first, f"{precision}: train/loss went from {first:.3f} to only {last:.3f}"


@pytest.mark.guarantee(
    "val/test run in eval mode without autograd; training returns to train mode; `zero_grad` sets grads to None"
)
@pytest.mark.slow
def test_eval_runs_in_eval_mode_without_autograd_and_zero_grad_sets_none(tmp_path: Path) -> None:
    cli = fit(
        tmp_path,
        "--model.net.init_args.dropout=0.5",  # two forwards agree only in eval mode
        "--trainer.max_epochs=2",
        "--trainer.limit_train_batches=6",
        "--trainer.limit_val_batches=2",
        "--trainer.limit_test_batches=2",
        "--trainer.accumulate_grad_batches=2",
        "--trainer.callbacks+=probes.Recorder",
    )
    modes = recorder_of(cli).modes
    evals = [m for m in modes if m[0] in ("val", "test")]
    assert {m[0] for m in evals} == {"val", "test"}
    assert all(m[1:] == (False, False, True) for m in evals), evals  # eval mode, no autograd, no dropout
    trains = [m for m in modes if m[0] == "train"]
    assert len(trains) == 12 and all(m[1:3] == (True, True) for m in trains)  # back in train mode after val
    # Gradients are set to None (not zero-filled) at the start of each window of 2 micro-batches, and kept
    # (accumulated) inside a window.
    assert recorder_of(cli).grads_were_none == [True, False] * 6


def _callbacks_overlay(tmp_path: Path, stopper: dict, extra: list[dict] | None = None) -> str:
    callbacks = [
        {
            "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
            "init_args": {"filename": "best", "monitor": "val/acc", "mode": "max"},
        },
        {"class_path": "lightning.pytorch.callbacks.EarlyStopping", "init_args": stopper},
        *(extra or []),
    ]
    path = tmp_path / "callbacks.yaml"
    path.write_text(yaml.safe_dump({"trainer": {"callbacks": callbacks}}))
    return str(path)


@pytest.mark.guarantee(
    "EarlyStopping stops after `patience` epochs without improvement; ModelCheckpoint keeps the best `val/acc`"
)
@pytest.mark.slow
def test_early_stopping_waits_patience_epochs_then_stops(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # min_delta larger than any possible change of val/loss: after the first epoch nothing counts as improvement.
    overlay = _callbacks_overlay(tmp_path, {"monitor": "val/loss", "mode": "min", "patience": 2, "min_delta": 100.0})
    cli = fit(
        tmp_path, "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1",
        "--trainer.limit_test_batches=1", configs=(DIGITS, overlay),
    )  # fmt: skip
    # Epoch 0 sets the best, epochs 1 and 2 wait, the run stops: 3 validations. (The stopper's own state is not
    # read here: the test after fit restores callback states from best.ckpt.)
    logged = scalars(tmp_path / "digits" / "version_0")
    assert len(logged["val/loss"]) == 3
    assert "Stopped early at epoch 2: Monitored metric val/loss did not improve in the last 2 records" in (
        capsys.readouterr().out
    )
    # ModelCheckpoint kept the best val/acc over the epochs, and best.ckpt holds that epoch.
    val_acc = [v for _, v in logged["val/acc"]]
    assert float(cli.trainer.checkpoint_callback.best_model_score) == pytest.approx(max(val_acc), abs=1e-7)
    best = torch.load(tmp_path / "digits" / "version_0" / "checkpoints" / "best.ckpt", weights_only=True)
    assert best["epoch"] == val_acc.index(max(val_acc))


@pytest.mark.guarantee(
    "a non-finite `val/loss` stops the run with a message; the final test uses the last finite best checkpoint"
)
@pytest.mark.slow
def test_a_non_finite_monitored_value_stops_the_run_with_a_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    overlay = _callbacks_overlay(
        tmp_path,
        {"monitor": "val/loss", "mode": "min", "patience": 10},
        [{"class_path": "probes.PoisonWeights", "init_args": {"epoch": 1}}],
    )
    cli = fit(tmp_path, "--trainer.limit_train_batches=3", "--trainer.limit_val_batches=2", configs=(DIGITS, overlay))
    assert len(scalars(tmp_path / "digits" / "version_0")["val/loss"]) == 2
    out = capsys.readouterr().out
    assert "Stopped early at epoch 1: Monitored metric val/loss = nan is not finite" in out
    # The final test used the best checkpoint (epoch 0, finite weights), not the poisoned last weights.
    best = torch.load(tmp_path / "digits" / "version_0" / "checkpoints" / "best.ckpt", weights_only=True)
    assert best["epoch"] == 0
    assert all(torch.isfinite(v).all() for v in best["state_dict"].values())
    assert math.isfinite(float(cli.trainer.callback_metrics["test/loss"]))


@pytest.mark.guarantee(
    "the optimizer's weight decay reaches conv kernels and linear weights, never a bias or a norm's weight; every "
    "parameter is in exactly one group"
)
def test_weight_decay_applies_to_weight_matrices_and_kernels_only(tmp_path: Path) -> None:
    # toy.BackboneNet has a convolution, a linear head, BatchNorm and biases: AdamW's decoupled decay must reach the
    # conv kernels and linear weights, and never a bias or a norm's weight (decaying those to 0 shrinks the
    # activations' scale for nothing), and every parameter is in exactly one group.
    cli = fit(tmp_path, "--trainer.fast_dev_run=true", "--model.net=toy.BackboneNet")
    names = {id(p): n for n, p in cli.model.named_parameters()}
    decay, no_decay = cli.trainer.optimizers[0].param_groups
    decayed, not_decayed = {names[id(p)] for p in decay["params"]}, {names[id(p)] for p in no_decay["params"]}
    kinds = {n: type(cli.model.get_submodule(n.rpartition(".")[0])) for n in names.values()}
    assert decay["weight_decay"] == 0.05 and no_decay["weight_decay"] == 0.0  # model.optimizer's, and none
    assert decayed == {n for n, k in kinds.items() if n.endswith(".weight") and k in (torch.nn.Conv2d, torch.nn.Linear)}
    assert not_decayed == set(names.values()) - decayed
    assert any(k is torch.nn.BatchNorm2d for n, k in kinds.items() if n in not_decayed)


@pytest.mark.guarantee(
    "data.eval_samples: a validation and the test read that many samples of their split, evenly spaced, the same "
    "every time; the loss over them is exact and its standard error is logged beside it"
)
def test_evaluation_reads_eval_samples_evenly_spaced_and_logs_the_loss_standard_error(tmp_path: Path) -> None:
    cli = fit(tmp_path, "--trainer.max_epochs=1", "--trainer.limit_train_batches=3", "--data.eval_samples=50")
    dm, task = cli.datamodule, cli.model.eval()
    assert len(dm.val_set) == 270 and len(dm.val_dataloader().dataset) == 50
    images, labels = dm.split_tensors("val")
    picked = [i * 270 // 50 for i in range(50)]  # evenly spaced over the split: the closed form
    with torch.no_grad():
        losses = F.cross_entropy(task(dm.normalize(images[picked])), labels[picked], reduction="none")
    logged = scalars(cli.trainer.log_dir)  # the one validation, of these weights (best.ckpt's, which the test loaded)
    # float32 sums of 50 terms (~1e-6 relative); the error's sums of squares cancel in part: 1e-4.
    assert logged["val/loss"][-1][1] == pytest.approx(losses.mean().item(), rel=1e-5)
    assert logged["val/loss_se"][-1][1] == pytest.approx((losses.std() / math.sqrt(50)).item(), rel=1e-4)
