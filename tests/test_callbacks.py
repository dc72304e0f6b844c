"""Your callbacks (project/callbacks.py): listed in the config, they run on what the evaluation steps hand them."""

from pathlib import Path

import numpy as np
import torch
from conftest import DIGITS, fit
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def test_the_output_histogram_is_the_validations_outputs(tmp_path: Path) -> None:
    cli = fit(tmp_path, "--trainer.max_epochs=2", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=2",
              "--trainer.limit_test_batches=1", "--trainer.callbacks+=project.callbacks.OutputHistogram",
              configs=(DIGITS,))  # fmt: skip
    events = EventAccumulator(str(cli.trainer.log_dir), size_guidance={"histograms": 0})
    events.Reload()
    histograms = events.Histograms("val/outputs")
    assert [h.step for h in histograms] == [2, 4]  # one per validation (not the sanity check), at its step
    # The last one holds exactly the outputs of the last epoch's weights (last.ckpt) on the two validation batches.
    model = cli.model.eval()
    last_ckpt = torch.load(Path(cli.trainer.log_dir) / "checkpoints" / "last.ckpt", weights_only=True)
    model.load_state_dict(last_ckpt["state_dict"])
    loader = iter(cli.datamodule.val_dataloader())
    with torch.no_grad():
        outputs = torch.cat([model(next(loader)[0]).flatten() for _ in range(2)])
    last = histograms[-1].histogram_value
    assert last.num == outputs.numel()
    # The same float32 values summed in float64 (TensorBoard's and here): equal up to the order of summation.
    assert np.isclose(last.sum, float(outputs.double().sum()), rtol=1e-9)
