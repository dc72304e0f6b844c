"""What the engine does for any task: the accumulation correction holds for a task with its own training_step."""

from pathlib import Path

import pytest
import torch
from conftest import fit
from probes import Recorder


@pytest.mark.guarantee(
    "the accumulation correction is the engine's: it holds for a task that writes its own `training_step`"
)
@pytest.mark.slow
def test_the_accumulation_correction_holds_for_a_task_with_its_own_training_step(tmp_path: Path) -> None:
    # The digits 0-2: 537 samples, 375 for training. Batch 3 x 4 micro-batches: 31 windows of 4 and a last window
    # of 1 micro-batch; batch 12: 31 batches of 12 and a last one of 3, the same samples in the same order.
    common = ("--data.digits=[0,1,2]", "--data.normalize=true",
              "--model=probes.OwnTrainingStep", "--model.net=toy.MLP", "--trainer.precision=64-true",
              "--trainer.max_epochs=1", "--trainer.limit_val_batches=0", "--trainer.callbacks+=probes.NoDropout",
              "--trainer.callbacks+=probes.Recorder", "--trainer.callbacks.keep_grads=true")  # fmt: skip
    runs = []
    for batch, k in ((3, 4), (12, 1)):
        cli = fit(tmp_path / f"{batch}", *common, f"--data.batch_size={batch}",
                  f"--trainer.accumulate_grad_batches={k}")  # fmt: skip
        runs.append(next(cb for cb in cli.trainer.callbacks if isinstance(cb, Recorder)))
    small, large = runs
    assert [i for b in small.batches() for i in b] == [i for b in large.batches() for i in b]
    assert len(small.grads) == len(large.grads) == 32
    # float64: summation order alone differs (~1e-16 relative per op); 1e-9 leaves 10^6 for the net's depth. The
    # uncorrected tail step (a quarter of its gradient: Lightning #19987) is O(1) off.
    for step, (a, b) in enumerate(zip(small.grads, large.grads, strict=True)):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11, msg=f"gradient of step {step}")
    assert not torch.allclose(small.grads[-1] * 0.25, large.grads[-1], rtol=1e-9, atol=1e-11)
