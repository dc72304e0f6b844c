"""float16 mixed precision on CUDA: a real GradScaler, saved in checkpoints, restored on resume, and a step with
inf gradients is skipped. (On CPU Lightning has no float16 autocast; tests/test_mechanics.py covers loss-scaled
clipping on CPU through an explicit plugin.)"""

from pathlib import Path

import pytest
import torch
from conftest import DEBUG, DIGITS, fit
from probes import InfGradAt, ScaleAtStart

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (16-mixed runs as bf16 on CPU)"),
    pytest.mark.guarantee(
        "under loss scaling, a step with inf gradients is skipped and the scale backs off",
    ),
]

FP16 = ("--trainer.accelerator=gpu", "--trainer.devices=1", "--trainer.precision=16-mixed")


def _probe(cli, kind):  # type: ignore[no-untyped-def]
    return next(cb for cb in cli.trainer.callbacks if isinstance(cb, kind))


@pytest.mark.guarantee("the fp16 GradScaler state is checkpointed and restored on resume")
def test_fp16_grad_scaler_state_is_checkpointed_and_restored(tmp_path: Path) -> None:
    cli = fit(tmp_path / "a", *FP16, configs=(DIGITS, DEBUG))
    scaler = cli.trainer.precision_plugin.scaler
    assert isinstance(scaler, torch.amp.GradScaler)
    last = tmp_path / "a" / "debug" / "version_0" / "checkpoints" / "last.ckpt"
    saved = torch.load(last, weights_only=True)["MixedPrecision"]
    assert saved["scale"] == scaler.get_scale()
    # Resume with a different initial scale in the fresh scaler: the checkpoint's scale must win.
    resumed = fit(
        tmp_path / "b", *FP16, f"--ckpt_path={last}", "--trainer.max_epochs=2",
        "--trainer.callbacks+=probes.ScaleAtStart", configs=(DIGITS, DEBUG),
    )  # fmt: skip
    assert _probe(resumed, ScaleAtStart).scale == saved["scale"]


def test_a_step_with_inf_gradients_is_skipped_and_the_scale_backs_off(tmp_path: Path) -> None:
    cli = fit(
        tmp_path, *FP16, "--trainer.callbacks+=probes.InfGradAt", "--trainer.callbacks.step=2",
        configs=(DIGITS, DEBUG),
    )  # fmt: skip
    probe = _probe(cli, InfGradAt)
    assert probe.before and probe.after
    for name, value in probe.before.items():
        assert torch.equal(probe.after[name], value), f"{name} changed in a step with inf gradients"
    assert probe.scales[1] == probe.scales[0] * 0.5  # GradScaler's backoff_factor
