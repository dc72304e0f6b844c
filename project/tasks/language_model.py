"""Language modelling: next-token cross-entropy weighted by token, judged by ``val/loss`` (min), with ``val/ppl``
(its exponential) and ``val/bpb`` (bits per byte: the split's summed loss in bits over the bytes of text its
predicted tokens stand for; ``val/loss`` is per token, so only bpb compares runs of different tokenizers) logged
beside it. A prediction is a generation: ``max_new_tokens`` sampled after each prompt, with ``temperature`` and
``top_k``, seeded by ``seed`` (the same prompt and seed give the same text); these four may be given at predict
time on any checkpoint (configs/tasks/language_model.yaml)."""

import math
from typing import Any

import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torchmetrics import Metric

from project.data.tokenizer import token_bytes
from project.engine import IGNORE_INDEX, ConfigError, Task


class TokensPerByte(Metric):
    """The counted tokens of a split over the bytes of text they stand for, exact across processes (both summed):
    with the token-weighted mean loss, the split's loss per byte."""

    full_state_update = False
    tokens: Tensor
    byte_count: Tensor

    def __init__(self) -> None:
        super().__init__()
        self.add_state("tokens", torch.tensor(0, dtype=torch.int64), dist_reduce_fx="sum")
        self.add_state("byte_count", torch.tensor(0, dtype=torch.int64), dist_reduce_fx="sum")

    def update(self, token_bytes: Tensor) -> None:  # type: ignore[override]
        self.tokens += token_bytes.numel()
        self.byte_count += token_bytes.sum()

    def compute(self) -> Tensor:
        return self.tokens / self.byte_count.clamp_min(1)


class LanguageModel(Task):
    """The net maps token ids (batch, T) to logits (batch, T, vocabulary); the target of each position is the
    next token."""

    monitor = "val/loss"
    mode = "min"
    target_kind = "classes"  # a class (a token of the vocabulary) per position
    counted = "tokens"
    class_dim = -1
    settable_at_predict = ("max_new_tokens", "temperature", "top_k", "seed")
    token_bytes: Tensor  # the bytes of text each id stands for (a buffer)
    val_tokens_per_byte: TokensPerByte
    test_tokens_per_byte: TokensPerByte

    def __init__(
        self,
        max_new_tokens: int = 200,
        temperature: float = 0.8,
        top_k: int | None = 40,
        seed: int = 0,
        **engine: Any,
    ) -> None:
        """
        Args:
            max_new_tokens: tokens generated after each prompt by ``predict``.
            temperature: the logits are divided by it before sampling; 0 = greedy (always the likeliest token).
            top_k: sample among the k likeliest tokens only; null = among all.
            seed: the sampling's seed (prompt i is sampled with seed + i).
            **engine: the net, optimizer and schedule settings of ``project.engine.Task``.
        """
        if max_new_tokens < 1:
            raise ConfigError(f"model.max_new_tokens={max_new_tokens!r}: must be >= 1.")
        if temperature < 0:
            raise ConfigError(f"model.temperature={temperature!r}: must be >= 0 (0 = greedy).")
        if top_k is not None and top_k < 1:
            raise ConfigError(f"model.top_k={top_k!r}: must be >= 1, or null for all tokens.")
        self.max_new_tokens, self.temperature, self.top_k, self.seed = max_new_tokens, temperature, top_k, seed
        super().__init__(**engine)
        # Not saved (persistent=False): derived from the vocabulary, which the checkpoint keeps as target_names.
        bytes_of = token_bytes(self.target_names) if self.target_names else []
        self.register_buffer("token_bytes", torch.tensor(bytes_of, dtype=torch.int64), persistent=False)
        self.val_tokens_per_byte, self.test_tokens_per_byte = TokensPerByte(), TokensPerByte()

    def loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        losses = F.cross_entropy(outputs.flatten(0, 1), targets.flatten(), reduction="none", ignore_index=IGNORE_INDEX)
        return losses.view_as(targets)

    def update_metrics(self, metrics: Any, outputs: Tensor, targets: Tensor) -> None:
        super().update_metrics(metrics, outputs, targets)
        if self.token_bytes.numel():  # not for a net built by hand without a vocabulary
            ratio = self.val_tokens_per_byte if metrics is self.val_metrics else self.test_tokens_per_byte
            ratio.update(self.token_bytes[targets[targets != IGNORE_INDEX]])

    def log_epoch(self, stage: str, loss_metric: Any, metrics: Any) -> None:
        super().log_epoch(stage, loss_metric, metrics)
        loss = loss_metric.compute()  # the exact token-weighted mean over the split (synced across processes)
        self.log(f"{stage}/ppl", loss.exp(), sync_dist=True)  # the same on every process: no warning
        if self.token_bytes.numel():  # the split's summed loss over its bytes of text, in bits
            ratio = self.val_tokens_per_byte if stage == "val" else self.test_tokens_per_byte
            self.log(f"{stage}/bpb", loss * ratio.compute().to(loss.device) / math.log(2), sync_dist=True)
            ratio.reset()

    def on_test_end(self) -> None:
        # What the scores mean to a reader: one continuation of a test prompt, sampled as predict samples.
        datamodule = getattr(self.trainer, "datamodule", None)
        test = getattr(datamodule, "test_set", None)
        # Sharded weights (FSDP) are gathered by each forward, a collective: then every rank generates (the same
        # tokens, from the same seed) and rank 0 shows them.
        if (not self.trainer.is_global_zero and self.device_mesh is None) or test is None or len(test) == 0:
            return
        questions = getattr(datamodule, "test_columns", {}).get("input")
        if hasattr(datamodule, "prompt_ids") and questions:  # chats: the first test chat's question, as predict asks
            prompt = datamodule.prompt_ids(questions[0])[None].to(self.device)  # type: ignore[union-attr]
        else:
            prompt = test[0][0][: max(1, len(test[0][0]) // 2)][None].to(self.device)
        was_training = self.training
        self.eval()
        generated = self.generate(prompt, torch.Generator(device=self.device).manual_seed(self.seed))
        self.train(was_training)
        given, new = (self.decode(ids[0].tolist()) for ids in (prompt, generated))
        # Through Lightning's logger, not print: the progress bar's live display redraws what is printed meanwhile.
        rank_zero_info(
            f"A sample ({self.max_new_tokens} tokens after a test prompt, temperature {self.temperature}):"
            f" {given!r} -> {new!r}"
        )

    # ---- predict: generation ----------------------------------------------------------------------------------

    @torch.no_grad()
    def generate(self, ids: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """``max_new_tokens`` token ids after the prompt ``ids`` (1, T), each from the logits of the last position
        given at most ``block_size`` tokens of context (nanoGPT's ``generate``); a net that generates itself (a
        pretrained model's ``generate``, with its KV cache) does."""
        if hasattr(self.net, "generate"):
            seed = generator.initial_seed() if generator is not None else self.seed
            return self.net.generate(ids, self.max_new_tokens, self.temperature, self.top_k, seed)  # type: ignore[operator]
        block = int(getattr(self.net, "block_size", ids.shape[1]))
        for _ in range(self.max_new_tokens):
            logits = self(ids[:, -block:])[:, -1, :].float()
            if self.temperature == 0:
                token = logits.argmax(-1, keepdim=True)
            else:
                logits = logits / self.temperature
                if self.top_k is not None:
                    kth = torch.topk(logits, min(self.top_k, logits.shape[-1])).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, -math.inf)
                token = torch.multinomial(logits.softmax(-1), 1, generator=generator)
            ids = torch.cat([ids, token], dim=1)
        return ids[:, -self.max_new_tokens :]

    def predict_step(self, batch: Any, batch_idx: int) -> Tensor:
        prompt = batch[0]
        generator = torch.Generator(device=prompt.device).manual_seed(self.seed + batch_idx)
        return self.generate(prompt, generator)

    def decode(self, ids: list[int]) -> str:
        """Token ids back to text: the net's own tokenizer's (a pretrained model's), else the vocabulary's bytes."""
        if hasattr(self.net, "decode"):
            return str(self.net.decode(ids))  # type: ignore[operator]
        from project.data.text import decode

        return decode(ids, self.target_names)

    def prediction_table(self, predictions: Tensor) -> tuple[list[str], list[list[Any]]]:
        return ["generated"], [[self.decode(row)] for row in predictions.long().tolist()]

    def output_description(self) -> dict[str, Any]:
        return {
            "name": "logits",
            "shape": ["batch", "sequence", len(self.target_names)],
            "vocabulary": len(self.target_names),
            "meaning": "next-token logits at every position: softmax over the last dimension gives the "
            "distribution of the token that follows",
        }
