"""Writing a trained model's predictions to a CSV file. What ``predict`` reads (``data.predict_path``) is the
DataModule's business: its ``load_predict_inputs`` decodes your files exactly as training decodes its samples."""

import csv
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import BasePredictionWriter


class CSVPredictionWriter(BasePredictionWriter):
    """Writes ``index, [input,] predicted, label, prob_<class name>...`` per input, in input order (one process):
    ``predicted`` is the class index, ``label`` its name, ``input`` the file the input came from when known."""

    def __init__(self, output: str = "predictions.csv") -> None:
        super().__init__(write_interval="epoch")
        self.output = output

    def write_on_epoch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, predictions: Any, batch_indices: Any
    ) -> None:
        probabilities = torch.cat(list(predictions)).float()
        dm = trainer.datamodule  # type: ignore[attr-defined]
        names = list(getattr(dm, "class_names", None) or range(probabilities.shape[1]))
        inputs = getattr(dm, "predict_names", None) if getattr(dm, "predict_set", None) is not None else None
        output = Path(self.output)
        output.parent.mkdir(parents=True, exist_ok=True)
        with open(output, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(
                ["index", *(["input"] if inputs else []), "predicted", "label", *(f"prob_{c}" for c in names)]
            )
            for index, row in enumerate(probabilities.tolist()):
                best = int(np.argmax(row))
                source = [inputs[index]] if inputs else []
                writer.writerow([index, *source, best, names[best], *(f"{p:.6g}" for p in row)])
        print(f"Wrote {len(probabilities)} predictions to {output}")
