"""A bidirectional transformer that classifies a text (``configs/tasks/text_classification.yaml``): the GPT's
blocks (``project/gpt.py``) without the causal mask, every token attending to every other that is not padding,
then the mean of the non-padding tokens' vectors through a linear head. Padding changes nothing: a text's logits
are the same whatever it is batched with (a test checks it), and the exported model takes one input, the ids."""

import torch
from torch import Tensor, nn

from project.gpt import Block, check_sizes, init_weights


class TextEncoder(nn.Module):
    def __init__(
        self,
        input_shape: tuple[int, ...],
        num_outputs: int,
        vocabulary: int = 257,
        pad: int = 256,
        layers: int = 2,
        heads: int = 4,
        width: int = 64,
        dropout: float = 0.1,
    ) -> None:
        """
        Args:
            input_shape: (max_length,), the longest text in tokens (linked from the DataModule).
            num_outputs: the classes (linked from the DataModule).
            vocabulary: token ids are < vocabulary (257: the bytes and ``<pad>``, as LabelledTextDataModule's).
            pad: the padding token's id, masked out of attention and of the mean.
        """
        super().__init__()
        check_sizes(input_shape, layers, heads, width, dropout)
        self.pad = pad
        self.tokens = nn.Embedding(vocabulary, width)
        self.positions = nn.Embedding(input_shape[0], width)
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(width, heads, dropout, causal=False) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, num_outputs)
        init_weights(self, layers)

    def forward(self, ids: Tensor) -> Tensor:
        keep = ids != self.pad  # (batch, T)
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.dropout(self.tokens(ids) + self.positions(positions))
        for block in self.blocks:
            x = block(x, keep[:, None, None, :])  # the keys each query may attend to
        x = self.norm(x) * keep[..., None]
        return self.head(x.sum(1) / keep.sum(1, keepdim=True).clamp_min(1))
