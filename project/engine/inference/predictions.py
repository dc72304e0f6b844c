"""Writing a trained model's predictions to a CSV file. What ``predict`` reads is the DataModule's business
(``project.engine.data.predict_inputs``)."""

import csv
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import BasePredictionWriter

from project.engine.hooks import defined_hooks_only


@defined_hooks_only
class CSVPredictionWriter(BasePredictionWriter):
    """Writes ``index, [the DataModule's columns,] <the task's columns>`` per input, in input order (one process): the
    task's ``prediction_table`` says what a prediction is (e.g. the predicted class and the probabilities, or values
    in the targets' units); the DataModule's ``predict_columns`` are what it carries through from the inputs (the
    file each came from, a table's ID columns), so the rows can be joined back to them. Files a prediction
    has beside its row (a segmentation's masks) are the task's ``write_prediction_files``, into the CSV's folder.

    ``output`` null: ``predictions.csv`` in the run directory of the checkpoint predicted with (the working directory
    without one), unless another writer in the list names its own file (``make predict OUTPUT=`` adds one)."""

    def __init__(self, output: str | None = None) -> None:
        super().__init__(write_interval="epoch")
        self.output = output

    def write_on_epoch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, predictions: Any, batch_indices: Any
    ) -> None:
        writers = [cb for cb in trainer.callbacks if isinstance(cb, CSVPredictionWriter)]  # type: ignore[attr-defined]
        if self.output is None and any(w.output is not None for w in writers):
            return  # another writer names its own file
        ckpt = trainer.ckpt_path  # <run>/checkpoints/best.ckpt
        run_dir = Path(ckpt).resolve().parent.parent if ckpt else Path.cwd()
        output = Path(self.output) if self.output is not None else run_dir / "predictions.csv"
        outputs = torch.cat(list(predictions)).float()
        header, rows = pl_module.prediction_table(outputs)  # type: ignore[operator]
        dm = trainer.datamodule  # type: ignore[attr-defined]
        on_a_file = getattr(dm, "predict_set", None) is not None
        carried = getattr(dm, "predict_columns" if on_a_file else "test_columns", {})
        # a carried column named like one of ours (a table's own "prediction" column) is kept under another name
        carried = {(f"input.{k}" if k in ("index", *header) else k): v for k, v in carried.items()}
        output.parent.mkdir(parents=True, exist_ok=True)
        with open(output, "w", newline="") as f:
            writer = csv.writer(f, lineterminator="\n")  # Unix line ends (the csv module writes \r\n)
            writer.writerow(["index", *carried, *header])
            for index, row in enumerate(rows):
                writer.writerow([index, *(values[index] for values in carried.values()), *row])
        pl_module.write_prediction_files(outputs, output.parent, dm)  # type: ignore[operator]
        print(f"Wrote {len(rows)} predictions to {output}")
