"""Two interleaved half-moons: a new problem in one file (docs/your-own.md, "Your data")."""

from typing import Any

import torch
from torch.utils.data import Dataset, TensorDataset

from project.engine import DataModule


class MoonsDataModule(DataModule):
    """2-D points on two noisy half-moons (scikit-learn's make_moons); the class is the moon."""

    def __init__(self, samples: int = 1000, noise: float = 0.2, **engine: Any) -> None:
        """
        Args:
            samples: how many points to draw.
            noise: standard deviation of the Gaussian noise added to each point.
            **engine: the loader, split and normalisation settings of DataModule.
        """
        super().__init__(**engine)
        self.target_names = ["upper", "lower"]  # label 0, label 1
        self.input_shape = (2,)  # one sample: an (x, y) point

    def load_dataset(self) -> Dataset:
        from sklearn.datasets import make_moons

        points, labels = make_moons(self.hparams["samples"], noise=self.hparams["noise"], random_state=0)
        return TensorDataset(torch.tensor(points, dtype=torch.float32), torch.tensor(labels))
