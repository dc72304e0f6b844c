"""The engine tests' own project: a DataModule, a task and nets written for the tests, apart from the shipped
examples (project/data, project/tasks, project/nets), so that deleting an example, or switching
configs/default.yaml to other data, never breaks a test of the engine. tests/configs/digits.yaml selects them
(``toy.Digits``, ``toy.Classifier``, ``toy.ConvNet``); tests/ is on the import path of the suite and of every
process it starts, so a checkpoint naming them loads anywhere in it.

Small on purpose: what the engine asks of a task and a DataModule, and nothing an example adds."""

import importlib.util
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import Dataset, TensorDataset
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy

from project.engine import ConfigError, DataModule, Task, WarmupSchedule


class Digits(DataModule):
    """scikit-learn's bundled 8x8 digits (offline), float32 in [0, 1], shaped (1, 8, 8). ``digits`` keeps those
    digits, as classes 0, 1, ... in that order (other label sets for the tests of starting weights). Predicts from
    ``.npy`` files."""

    def __init__(self, *, digits: list[int] | None = None, normalize: bool = False, **engine: Any) -> None:
        super().__init__(normalize=normalize, **engine)
        self.digits = list(range(10)) if digits is None else digits
        self.target_names = [str(digit) for digit in self.digits]
        self.input_shape = (1, 8, 8)

    def load_dataset(self) -> Dataset:
        # scikit-learn's own file, read as load_digits() reads it, without importing scikit-learn, whose import
        # (and load_digits) took 1.0 s of a process's start against 6.1 s for torch and Lightning, measured on a
        # loaded 2-core machine, in each of the suite's many processes (test_data checks the samples are equal).
        sklearn = importlib.util.find_spec("sklearn")
        assert sklearn is not None and sklearn.submodule_search_locations, "scikit-learn is not installed"
        path = Path(next(iter(sklearn.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
        data = np.loadtxt(path, delimiter=",")
        target = data[:, -1].astype(int)
        keep = np.isin(target, self.digits)
        images = torch.tensor(data[keep, :-1].reshape(-1, 8, 8), dtype=torch.float32).unsqueeze(1) / 16.0
        classes = torch.tensor([self.digits.index(d) for d in target[keep]], dtype=torch.int64)
        return TensorDataset(images, classes)

    def load_predict_inputs(self, path: Path) -> Tensor:
        if path.suffix != ".npy":
            raise ConfigError(f"data.predict_path={str(path)!r}: expected a .npy file.")
        return self.check_predict_inputs(path, np.load(path, allow_pickle=False))


class Classifier(Task):
    """Cross-entropy, judged by accuracy (max); a prediction is the class probabilities."""

    monitor = "val/acc"
    mode = "max"

    def loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        return F.cross_entropy(outputs, targets, reduction="none")

    def configure_metrics(self) -> MetricCollection:
        return MetricCollection({"acc": MulticlassAccuracy(len(self.target_names), average="micro")})

    def prediction(self, outputs: Tensor) -> Tensor:
        return outputs.softmax(dim=-1)

    def prediction_table(self, predictions: Tensor) -> tuple[list[str], list[list[Any]]]:
        names, best = self.target_names, predictions.argmax(dim=-1).tolist()
        rows = [[names[b], *(f"{p:.6g}" for p in row)] for b, row in zip(best, predictions.tolist(), strict=True)]
        return ["predicted_class", *(f"prob_{n}" for n in names)], rows


class MLP(nn.Module):
    def __init__(self, input_shape: tuple[int, ...], num_outputs: int, hidden: int = 64, dropout: float = 0.1) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), hidden), nn.ReLU(),
                                    nn.Dropout(dropout), nn.Linear(hidden, num_outputs))  # fmt: skip

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)


class FrozenBaseNet(MLP):
    """An MLP whose first linear layer needs no gradient from the start, as a LoRA fine-tune's base: no optimizer
    holds it."""

    def __init__(self, input_shape: tuple[int, ...], num_outputs: int, hidden: int = 16) -> None:
        super().__init__(input_shape, num_outputs, hidden)
        self.layers[1].requires_grad_(False)


class ConvNet(nn.Module):
    """Two 3x3 convolutions and a 2x2 max-pool, then a linear layer (the shipped ConvNet's layers: the engine
    tests' thresholds, e.g. the loss halved in 2 epochs, were set on it)."""

    def __init__(self, input_shape: tuple[int, ...], num_outputs: int, channels: int = 32, dropout: float = 0.1):
        super().__init__()
        c, h, w = input_shape
        self.layers = nn.Sequential(
            nn.Conv2d(c, channels, 3, padding=1), nn.ReLU(), nn.Conv2d(channels, 2 * channels, 3, padding=1),
            nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Dropout(dropout),
            nn.Linear(2 * channels * (h // 2) * (w // 2), num_outputs),
        )  # fmt: skip

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)


class BackboneNet(nn.Module):
    """A ``backbone`` (conv, BatchNorm, ReLU: what model.freeze_backbone and backbone_lr_scale act on) and a linear
    ``head``: conv kernels, a linear weight, a norm and biases, each of which weight decay must treat apart."""

    def __init__(self, input_shape: tuple[int, ...], num_outputs: int, width: int = 8) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(input_shape[0], width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU())
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, num_outputs))

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.backbone(x))


class Regressor(Task):
    """Values, not classes: mean squared error per sample (what the engine's check of task against data meets)."""

    target_kind = "values"

    def loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        return (outputs - targets).square().mean(dim=-1)


class HalvingSchedule(torch.optim.lr_scheduler.LambdaLR):
    """A schedule of a user's own, by class path: built as the engine builds any, (optimizer, total_steps,
    warmup_steps, **init_args); the lr halves every ``every`` optimizer steps."""

    def __init__(self, optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int, every: int = 5) -> None:
        self.every = every
        super().__init__(optimizer, lambda step: 0.5 ** (step // every))


def param_groups(parameters: list[tuple[str, nn.Parameter]]) -> list[dict[str, Any]]:
    """The tests' parameter-group rule (the shipped recipe's, written apart): matrices and kernels decay, the rest
    not."""
    return [
        {"params": [p for _, p in parameters if p.ndim >= 2], "name": "decay"},
        {"params": [p for _, p in parameters if p.ndim < 2], "name": "no_decay", "weight_decay": 0.0},
    ]


class WarmupCosine(WarmupSchedule):
    """The tests' cosine after warmup, on the engine's base: the closed form ``conftest.warmup_cosine`` checks."""

    def decay(self, step: int, peak: float, floor: float) -> float:
        return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * self.progress(step)))
