"""The engine tests' own token-sequence fixture (no shipped example): sequences of 1 to 12 token ids, padded per
batch, with a tiny per-token task. Lengths differ a lot from sample to sample, so a loss averaged per micro-batch
(or per process) weights tokens unequally: the token-weighted mechanics are visible in every step."""

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import Dataset

from project.engine import IGNORE_INDEX, DataModule, Task

VOCABULARY = 11  # token 0 is padding
PAD = 0


class _Sequences(Dataset):
    def __init__(self, seed: int, count: int, longest: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        lengths = torch.randint(1, longest + 1, (count,), generator=generator).tolist()
        self.samples = [torch.randint(1, VOCABULARY, (n,), generator=generator) for n in lengths]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        x = self.samples[index]
        return x, (x * 3 + 1) % (VOCABULARY - 1) + 1  # the target of each position: a fixed function of its token


def pad(samples: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """To the batch's longest: inputs with PAD, targets with IGNORE_INDEX."""
    xs, ys = zip(*samples, strict=True)
    inputs = nn.utils.rnn.pad_sequence(list(xs), batch_first=True, padding_value=PAD)
    targets = nn.utils.rnn.pad_sequence(list(ys), batch_first=True, padding_value=IGNORE_INDEX)
    return inputs, targets


class VariableLengthTokens(DataModule):
    """``train_samples`` training sequences (then 12 for validation and 12 for test), each 1 to ``longest``
    tokens long."""

    input_dtype = torch.int64
    collate_fn = staticmethod(pad)

    def __init__(self, train_samples: int = 24, longest: int = 12, **engine: Any) -> None:
        super().__init__(**engine)
        self.train_samples, self.longest = train_samples, longest
        self.vocabulary = ["<pad>", *(f"t{i}" for i in range(1, VOCABULARY))]
        self.target_names = list(self.vocabulary)
        self.input_shape = (longest,)

    def load_splits(self) -> tuple[Dataset, Dataset, Dataset]:
        seed = self.hparams["split_seed"]
        return (_Sequences(seed, self.train_samples, self.longest), _Sequences(seed + 1, 12, self.longest),
                _Sequences(seed + 2, 12, self.longest))  # fmt: skip


class TokenNet(nn.Module):
    """Embedding -> tanh -> linear, per position, plus the mean of the sequence's earlier embeddings (so a position
    sees its past, as a language model's does)."""

    def __init__(self, input_shape: tuple[int, ...], num_outputs: int, width: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(num_outputs, width)
        self.hidden = nn.Linear(2 * width, width)
        self.out = nn.Linear(width, num_outputs)

    def forward(self, x: Tensor) -> Tensor:
        e = self.embed(x)
        past = e.cumsum(1) / torch.arange(1, x.shape[1] + 1, device=x.device, dtype=e.dtype)[:, None]
        return self.out(torch.tanh(self.hidden(torch.cat([e, past], -1))))


class TokenTagger(Task):
    """A class per position, cross-entropy per token (padding left out), judged by val/loss."""

    monitor, mode = "val/loss", "min"
    counted = "tokens"
    class_dim = -1

    def loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        return F.cross_entropy(outputs.transpose(1, 2), targets, reduction="none", ignore_index=IGNORE_INDEX)
