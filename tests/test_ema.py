"""The EMA of the weights (project.engine.EMA): the closed form once per optimizer step, what validation, the
best checkpoint and the final test evaluate, and no host read per step."""

from pathlib import Path

import pytest
import torch
from conftest import DIGITS, HOST_SYNCS, ROOT, fit, offending_ops, run_ranks, scalars, scratch_dir
from probes import StepWeights

from project.engine import EMA

DECAY = 0.9
# 2 epochs of 5 batches in windows of 2 (2, 2 and a short 1): 3 optimizer steps an epoch, 6 in all.
RUN = ("--trainer.max_epochs=2", "--trainer.limit_train_batches=5", "--trainer.limit_val_batches=2",
       "--trainer.limit_test_batches=2", "--trainer.accumulate_grad_batches=2", "--trainer.enable_progress_bar=false",
       "--trainer.callbacks+=probes.StepWeights", "--trainer.callbacks+=project.engine.EMA",
       f"--trainer.callbacks.decay={DECAY}")  # fmt: skip


@pytest.fixture(scope="module")
def ema_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    base = tmp_path_factory.mktemp("ema")
    cli = fit(base, *RUN)
    run = Path(cli.trainer.log_dir)
    return {"cli": cli, "run": run, "steps": list(StepWeights.taken),
            "last": torch.load(run / "checkpoints" / "last.ckpt", weights_only=True),
            "best": torch.load(run / "checkpoints" / "best.ckpt", weights_only=True)}  # fmt: skip


def _split(cli, stage: str) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[no-untyped-def]
    """The first 2 batches of the run's validation or test loader (limit_*_batches=2), as one batch."""
    loader = getattr(cli.datamodule, f"{stage}_dataloader")()
    batches = [batch for _, batch in zip(range(2), loader, strict=False)]
    return torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])


def _scores(cli, weights: dict[str, torch.Tensor], stage: str) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """(accuracy, mean cross-entropy) of the task with ``weights`` on the split, computed here."""
    task = cli.model
    raw = {k: v.clone() for k, v in task.state_dict().items()}
    task.load_state_dict(weights)
    task.eval()
    images, labels = _split(cli, stage)
    with torch.no_grad():
        logits = task(images)
    task.load_state_dict(raw)
    return (logits.argmax(-1) == labels).float().mean().item(), torch.nn.functional.cross_entropy(logits, labels).item()


@pytest.mark.guarantee(
    "EMA: after each optimizer step (accumulation included) the average is decay * average + (1 - decay) * weights, "
    "from a copy at the first step; the checkpoint's state_dict is the average, the raw weights beside it"
)
def test_the_average_is_the_closed_form_once_per_optimizer_step(ema_run: dict) -> None:
    steps, last = ema_run["steps"], ema_run["last"]
    assert len(steps) == last["global_step"] == 6 and int(last["averaging_state"]["n_averaged"]) == 6
    expected = {k: v.double() for k, v in steps[0].items()}
    for weights in steps[1:]:
        expected = {k: DECAY * expected[k] + (1 - DECAY) * weights[k].double() for k in expected}
    for name, value in expected.items():
        got = last["state_dict"][name]
        if not got.is_floating_point():  # BatchNorm's batch counter: the current one
            assert torch.equal(got, steps[-1][name]), name
            continue
        # Each float32 lerp rounds 3 times (<= 1.5 ulp of the average); earlier errors shrink by DECAY each step:
        # at most 1.5 / (1 - DECAY) = 15 ulp, 16 * 2**-24 of the largest magnitude.
        scale = max(value.abs().max().item(), 1e-30)
        torch.testing.assert_close(got.double(), value, rtol=0, atol=16 * 2**-24 * scale, msg=name)
        assert torch.equal(last["current_model_state"][name], steps[-1][name]), name  # the raw weights, as trained


@pytest.mark.guarantee("EMA with warmup: step t's decay is min(decay, (1 + t) / (10 + t)), t the optimizer step")
def test_a_warmed_up_average_is_its_closed_form(tmp_path: Path) -> None:
    cli = fit(tmp_path, *RUN, "--trainer.callbacks.warmup=true", "--trainer.max_epochs=1")
    steps = list(StepWeights.taken)
    last = torch.load(Path(cli.trainer.log_dir) / "checkpoints" / "last.ckpt", weights_only=True)
    assert len(steps) == last["global_step"] == 3
    expected = {k: v.double() for k, v in steps[0].items() if v.is_floating_point()}
    for t, weights in enumerate(steps[1:], start=2):  # the update after optimizer step t
        decay = min(DECAY, (1 + t) / (10 + t))  # 0.25 and 0.31 here: far below DECAY
        expected = {k: decay * expected[k] + (1 - decay) * weights[k].double() for k in expected}
    for name, value in expected.items():  # the rounding bound of the closed-form test above (decay <= DECAY)
        scale = max(value.abs().max().item(), 1e-30)
        torch.testing.assert_close(last["state_dict"][name].double(), value, rtol=0, atol=16 * 2**-24 * scale)


@pytest.mark.guarantee(
    "EMA: a parameter that needs no gradient when training starts (a LoRA fine-tune's frozen base) is the task's own "
    "in the average, not a copy; unfrozen later, the average copies it then and averages it from there"
)
def test_the_average_shares_what_needs_no_gradient_and_averages_it_once_unfrozen(tmp_path: Path) -> None:
    cli = fit(tmp_path, *RUN, "--model.net=toy.FrozenBaseNet", "--trainer.max_epochs=1")
    ema, task = next(cb for cb in cli.trainer.callbacks if isinstance(cb, EMA)), cli.model
    average = ema._average_model.module
    frozen = {name for name, p in task.named_parameters() if not p.requires_grad}
    assert frozen == {"net.layers.1.weight", "net.layers.1.bias"}
    for name, p in task.named_parameters():  # the frozen ones shared, the trained ones averaged apart
        assert (average.get_parameter(name) is p) == (name in frozen), name
    task.net.layers[1].requires_grad_(True)  # unfrozen (as a callback of the user's might)
    ema._latest_update_step = 1  # the next update: past the first
    ema.on_train_batch_end(cli.trainer, task)
    weight, before = task.get_parameter("net.layers.1.weight"), task.get_parameter("net.layers.1.weight").clone()
    assert average.get_parameter("net.layers.1.weight") is not weight  # a copy of its own now, equal to the weights
    assert torch.equal(average.get_parameter("net.layers.1.weight"), before)
    with torch.no_grad():
        weight.add_(1.0)
    ema._latest_update_step = 1
    ema.on_train_batch_end(cli.trainer, task)  # averaged: DECAY * before + (1 - DECAY) * (before + 1)
    torch.testing.assert_close(average.get_parameter("net.layers.1.weight"), before + (1 - DECAY), rtol=0, atol=1e-6)


@pytest.mark.guarantee(
    "EMA: validation (so best.ckpt's choice) and the final test evaluate the average, equal to evaluating it by hand"
)
def test_validation_and_the_final_test_evaluate_the_average(ema_run: dict) -> None:
    cli, last, best = ema_run["cli"], ema_run["last"], ema_run["best"]
    metrics = cli.trainer.callback_metrics  # the final test's, and the last validation's
    acc, loss = _scores(cli, best["state_dict"], "test")
    assert float(metrics["test/acc"]) == acc  # a ratio of counts: exact
    assert float(metrics["test/loss"]) == pytest.approx(loss, rel=1e-6)  # float32 means in another order
    # The last validation ran on the average at the end of training (last.ckpt's state_dict), not the raw weights.
    logged = scalars(ema_run["run"])
    acc, loss = _scores(cli, last["state_dict"], "val")
    _, raw_loss = _scores(cli, last["current_model_state"], "val")
    assert logged["val/loss"][-1][1] == pytest.approx(loss, rel=1e-6) and loss != pytest.approx(raw_loss, rel=1e-6)
    assert logged["val/acc"][-1][1] == pytest.approx(acc, abs=1e-7)  # a ratio of counts, stored as float32


@pytest.mark.guarantee("EMA: `make export` exports the average (parity with the averaged task), not the raw weights")
def test_the_export_is_the_average(ema_run: dict) -> None:
    from project.engine.inference.export import export

    cli, best = ema_run["cli"], ema_run["run"] / "checkpoints" / "best.ckpt"
    export(best)
    program = torch.export.load(best.parent / "model.pt2").module()
    images, _ = _split(cli, "test")
    task, raw = cli.model, {k: v.clone() for k, v in cli.model.state_dict().items()}
    outputs = {}
    for name in ("state_dict", "current_model_state"):
        task.load_state_dict(ema_run["best"][name])
        with torch.no_grad():
            outputs[name] = task.eval()(images)
    task.load_state_dict(raw)
    exported = program(images)
    torch.testing.assert_close(exported, outputs["state_dict"], rtol=0, atol=1e-4)  # export's own parity bound
    assert not torch.allclose(exported, outputs["current_model_state"], rtol=0, atol=1e-4)


def test_an_update_reads_nothing_on_the_host(ema_run: dict) -> None:
    cli = ema_run["cli"]
    ema = next(cb for cb in cli.trainer.callbacks if isinstance(cb, EMA))
    task, trainer = cli.model, cli.trainer
    ema.setup(trainer, task, "fit")  # a fresh average (fit's ended)
    ema._latest_update_step, ema.warmup = 1, True  # past the first step (a copy): the lerp, its decay warmed up
    step = trainer.global_step
    syncs = offending_ops(lambda func, *_: func.overloadpacket.__name__ in HOST_SYNCS,
                          lambda: ema.on_train_batch_end(trainer, task))  # fmt: skip
    assert not syncs and trainer.global_step == step and ema._latest_update_step == step, syncs


@pytest.mark.guarantee("EMA with decay outside [0, 1) is refused naming the value")
def test_a_decay_outside_the_unit_interval_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from project.engine import main

    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", DIGITS, f"--trainer.logger.init_args.save_dir={tmp_path}",
              "--trainer.callbacks+=project.engine.EMA", "--trainer.callbacks.decay=1.0"])  # fmt: skip
    assert exit_info.value.code == 2 and "EMA decay=1.0: give a number in [0, 1)" in capsys.readouterr().err
    assert not (tmp_path / "digits").exists()


@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.guarantee(
    "EMA: two DDP processes end with the average (and the raw weights) of one process on the combined batch"
)
def test_two_processes_average_as_one(tmp_path: Path) -> None:
    from test_ddp import ATOL

    # float64 and no dropout, as the DDP equivalence tests (tests/test_ddp.py): only the gradient's summation order
    # differs, so the weights, and the average of them, agree to ATOL.
    common = ("--trainer.max_epochs=1", "--trainer.limit_train_batches=6", "--trainer.limit_val_batches=2",
              "--trainer.limit_test_batches=2", "--trainer.accelerator=cpu", "--data.drop_last=true",
              "--model.net.init_args.dropout=0.0", "--trainer.precision=64-true",
              "--trainer.callbacks+=project.engine.EMA", f"--trainer.callbacks.decay={DECAY}")  # fmt: skip
    fit(tmp_path / "one", *common, "--data.batch_size=32")
    two = run_ranks("fit", "--config", DIGITS, "--config", str(ROOT / "configs" / "ddp.yaml"), *common,
                    "--data.batch_size=16", f"--trainer.logger.init_args.save_dir={tmp_path / 'two'}",
                    cwd=scratch_dir())  # fmt: skip
    assert two.returncode == 0, two.stderr[-3000:]
    one_last, two_last = (torch.load(tmp_path / r / "digits" / "version_0" / "checkpoints" / "last.ckpt",
                                     weights_only=True) for r in ("one", "two"))  # fmt: skip
    assert one_last["global_step"] == two_last["global_step"] == 6
    for key in ("state_dict", "current_model_state"):
        for name, value in one_last[key].items():
            torch.testing.assert_close(two_last[key][name], value, rtol=0, atol=ATOL, msg=f"{key} {name}")
