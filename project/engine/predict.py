"""Writing a trained model's predictions to a CSV file. What ``predict`` reads (``data.predict_path``) is the
DataModule's business: its ``load_predict_inputs`` decodes your files exactly as training decodes its samples."""

import csv
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import BasePredictionWriter


class CSVPredictionWriter(BasePredictionWriter):
    """Writes ``index, [input,] <the task's columns>`` per input, in input order (one process): the task's
    ``prediction_table`` says what a prediction is (e.g. the predicted class and the probabilities, or values in
    the targets' units); ``input`` is the file the input came from, when the DataModule knows it. Files a prediction
    has beside its row (a segmentation's masks) are the task's ``write_prediction_files``, into the CSV's folder."""

    def __init__(self, output: str = "predictions.csv") -> None:
        super().__init__(write_interval="epoch")
        self.output = output

    def write_on_epoch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, predictions: Any, batch_indices: Any
    ) -> None:
        outputs = torch.cat(list(predictions)).float()
        header, rows = pl_module.prediction_table(outputs)  # type: ignore[operator]
        dm = trainer.datamodule  # type: ignore[attr-defined]
        inputs = getattr(dm, "predict_names", None) if getattr(dm, "predict_set", None) is not None else None
        output = Path(self.output)
        output.parent.mkdir(parents=True, exist_ok=True)
        with open(output, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["index", *(["input"] if inputs else []), *header])
            for index, row in enumerate(rows):
                writer.writerow([index, *([inputs[index]] if inputs else []), *row])
        pl_module.write_prediction_files(outputs, output.parent, dm)  # type: ignore[operator]
        print(f"Wrote {len(rows)} predictions to {output}")
