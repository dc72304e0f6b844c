"""Instruction data for supervised fine-tuning (SFT) of a pretrained causal language model
(``configs/tasks/sft.yaml``): a JSON Lines file whose rows are chats, ``{"messages": [{"role": "user", "content":
...}, {"role": "assistant", "content": ...}, ...]}``, or ``{"prompt": ..., "completion": ...}`` pairs (a user turn
and the assistant's answer).

Each chat is rendered with the model's own chat template (``data.tokenizer``'s) and tokenised once, when the data
is set up. The loss counts the assistant's tokens only, end-of-turn token included (so generation learns to stop):
what the template renders for an assistant turn, found by rendering the chat up to the turn with and without it,
which works for any template (Qwen's and Llama's have no ``{% generation %}`` markers). A chat longer than
``max_length`` tokens keeps its first ones; one left with no assistant token is refused, naming its row. The
sample is the ids but the last (the input) and the labels but the first (the target of each position is the next
token), padded per batch; ``predict`` reads prompts (a ``.txt`` file: a user turn per line) and generates the
assistant's answer with the model's own ``generate``.

The tokenised chats are kept beside the file (``<folder>/.cache/<name>-<key>.pt``, the key a hash of the chats, the
tokenizer, its template and ``max_length``): a later run on the same chats reads them back instead.

``pack: true`` packs the training chats, whole and in order, into blocks of up to ``max_length`` tokens, so a batch
holds few pad tokens. Each block's input is (2, n): the token ids over each chat's positions, counted from 0 at every
chat's start; from them transformers keeps every token's attention within its own chat (its packed-sequence mask), so
a packed chat's logits are its own. The validation and test chats are not packed.
"""

import contextlib
import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from project.data.labelled_text import huggingface_tokenizer_file, pretrained_path, read_rows, transformers_module
from project.engine import IGNORE_INDEX, ConfigError, DataModule


def pad_chats(samples: list[tuple[Tensor, Tensor]], pad: int) -> tuple[Tensor, Tensor]:
    """Inputs padded with ``pad`` (the model never attends to them: they come after every real token, and the
    model is causal), targets with ``IGNORE_INDEX``; a packed block's inputs (2, n) along their last dimension."""
    inputs, targets = zip(*samples, strict=True)
    padded = nn.utils.rnn.pad_sequence([x.movedim(0, -1) for x in inputs], batch_first=True, padding_value=pad)
    return (
        padded.transpose(1, -1) if padded.ndim == 3 else padded,
        nn.utils.rnn.pad_sequence(list(targets), batch_first=True, padding_value=IGNORE_INDEX),
    )


def pack_chats(samples: list[tuple[Tensor, Tensor]], max_length: int) -> list[tuple[Tensor, Tensor]]:
    """Chats (inputs, targets) packed whole, in order, into blocks of up to ``max_length`` tokens: a block's input is
    its chats' ids over their positions (2, n), each chat's from 0; its targets are theirs, one after another."""
    blocks: list[list[tuple[Tensor, Tensor]]] = []
    filled = max_length  # tokens in the last block: none yet, so the first chat opens one
    for x, y in samples:
        if filled + len(x) > max_length:
            blocks.append([])
            filled = 0
        blocks[-1].append((x, y))
        filled += len(x)
    return [
        (
            torch.stack([torch.cat([x for x, _ in block]), torch.cat([torch.arange(len(x)) for x, _ in block])]),
            torch.cat([y for _, y in block]),
        )
        for block in blocks
    ]


ROLES = ("system", "user", "assistant", "tool")


def messages_of(row: dict[str, Any], where: str) -> list[dict[str, str]]:
    """A row's chat, each turn a role and a text; refused in one sentence if a turn is not, or an answer is empty."""
    if isinstance(row.get("messages"), list) and row["messages"]:
        messages = row["messages"]
    elif "prompt" in row and "completion" in row:
        messages = [{"role": "user", "content": row["prompt"]}, {"role": "assistant", "content": row["completion"]}]
    else:
        raise ConfigError(
            f"{where}: a row holds either messages (a list of role and content) or prompt and completion."
        )
    for i, m in enumerate(messages, 1):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise ConfigError(
                f"{where}, turn {i}: {json.dumps(m)[:80]} is not a turn: a role among {list(ROLES)} "
                "and a content that is text."
            )
        if m["role"] == "assistant" and not m["content"].strip():
            raise ConfigError(
                f"{where}, turn {i}: an empty answer (the assistant's content); there is nothing to learn."
            )
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def tokenize_chat(tokenizer: Any, messages: list[dict[str, str]], max_length: int, where: str) -> tuple[Tensor, Tensor]:
    """(ids, labels) of a chat: labels are the ids of the assistant's turns and ``IGNORE_INDEX`` elsewhere."""

    def render(upto: int, prompt: bool = False) -> str:
        if upto == 0:
            return ""
        return tokenizer.apply_chat_template(messages[:upto], tokenize=False, add_generation_prompt=prompt)

    spans, before = [], ""  # the characters of each assistant turn in the whole chat's text
    for i, message in enumerate(messages):
        text = render(i + 1)
        prompt = render(i, prompt=True) if message["role"] == "assistant" else before
        if not (text.startswith(prompt) and prompt.startswith(before)):
            raise ConfigError(
                f"{where}: the tokenizer's chat template renders a chat's first turns differently "
                "from the chat's beginning, so the assistant's tokens cannot be told apart."
            )
        if message["role"] == "assistant":
            spans.append((len(prompt), len(text)))
        before = text
    # The whole text tokenised at once (as the model saw text in pretraining), each token labelled by where it starts.
    encoded = tokenizer(before, add_special_tokens=False, return_offsets_mapping=True)
    ids = encoded["input_ids"][: max_length + 1]
    labels = [
        i if any(s <= begin < e for s, e in spans) else IGNORE_INDEX
        for i, (begin, _) in zip(ids, encoded["offset_mapping"], strict=False)
    ]
    if all(label == IGNORE_INDEX for label in labels[1:]):
        raise ConfigError(
            f"{where}: no assistant token is left to learn from (none in the chat, or all after the "
            f"first data.max_length={max_length} tokens)."
        )
    return torch.tensor(ids[:-1]), torch.tensor(labels[1:])


class _Chats(Dataset):
    def __init__(self, samples: list[tuple[Tensor, Tensor]]) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        return self.samples[index]


class ChatDataModule(DataModule):
    """Chats (or prompt and completion pairs) in the model's own chat template, split at random by ``split_seed``."""

    input_dtype = torch.int64

    def __init__(
        self,
        path: str,
        tokenizer: str,
        max_length: int = 1024,
        pack: bool = False,
        *,
        normalize: bool = False,
        **engine: Any,
    ) -> None:
        """
        Args:
            path: a ``.jsonl`` file of chats (``messages``) or of ``prompt`` and ``completion`` pairs.
            tokenizer: the model's tokenizer, with its chat template: a directory or a hub id in the local cache.
            max_length: tokens kept of each chat (its first ones), and of a packed block.
            pack: pack the training chats into blocks of up to ``max_length`` tokens, each chat attending to itself
                alone (fewer pad tokens: faster on chats of mixed lengths; a batch is then ``batch_size`` blocks).
            normalize: must stay false (token ids are not standardised).
            **engine: the loader and split settings of ``DataModule`` (batch_size, num_workers, ...).
        """
        super().__init__(normalize=normalize, **engine)
        if max_length < 2:
            raise ConfigError(f"data.max_length={max_length!r}: a chat needs at least two tokens.")
        where = pretrained_path(tokenizer, "data.tokenizer", download=False)
        self.tokenizer = transformers_module().AutoTokenizer.from_pretrained(where, local_files_only=True)
        if not self.tokenizer.chat_template:
            raise ConfigError(
                f"data.tokenizer={tokenizer!r} has no chat template: use the model's instruct version "
                "(or give its tokenizer_config.json a chat_template)."
            )
        if self.tokenizer.pad_token_id is None:  # padding is never attended to nor counted: any id does
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.pad_id = self.tokenizer.pad_token_id
        self.collate_fn = functools.partial(pad_chats, pad=self.pad_id)
        self.input_shape = (max_length,)
        self.vocabulary = self.tokenizer.convert_ids_to_tokens(list(range(len(self.tokenizer))))
        self.target_names = list(self.vocabulary)
        if self.restored():  # predict on prompts, export: the chats are not read
            return
        self._rows = read_rows(Path(path), "data.path")
        if Path(path).suffix != ".jsonl" or not self._rows:
            raise ConfigError(f"data.path={path!r}: expected a .jsonl file of chats, one per line.")

    def load_dataset(self) -> Dataset:
        path = self.hparams["path"]
        where = [f"data.path={path!r}, row {i}" for i in range(1, len(self._rows) + 1)]
        chats = [messages_of(row, at) for row, at in zip(self._rows, where, strict=True)]
        _, _, test = self.split_indices(len(chats))  # the test split's predictions carry each chat's first question
        self.test_columns = {"input": [next((m["content"] for m in chats[i] if m["role"] == "user"), "") for i in test]}
        return _Chats(self._tokenized(chats, where))

    def _tokenized(self, chats: list[list[dict[str, str]]], where: list[str]) -> list[tuple[Tensor, Tensor]]:
        """The chats tokenised, or read back from the cache of an earlier run that tokenised the same."""
        length, path = self.input_shape[0], Path(self.hparams["path"])
        key = json.dumps([chats, self.tokenizer.backend_tokenizer.to_str(), self.tokenizer.chat_template, length])
        cache = path.parent / ".cache" / f"{path.stem}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.pt"
        if cache.is_file():
            kept = torch.load(cache, weights_only=True)
            rank_zero_info(f"Read the {len(chats)} tokenised chats from {cache}.")
            lengths = kept["lengths"].tolist()
            return list(zip(kept["ids"].split(lengths), kept["labels"].split(lengths), strict=True))
        samples = [tokenize_chat(self.tokenizer, chat, length, at) for chat, at in zip(chats, where, strict=True)]
        with contextlib.suppress(OSError):  # a read-only data folder: no cache, the chats are tokenised every run
            cache.parent.mkdir(exist_ok=True)
            partial = cache.with_suffix(f".{os.getpid()}.partial")  # renamed whole: another process may read it
            torch.save(
                {
                    "ids": torch.cat([x for x, _ in samples]),
                    "labels": torch.cat([y for _, y in samples]),
                    "lengths": torch.tensor([len(x) for x, _ in samples]),
                },
                partial,
            )
            os.replace(partial, cache)
        return samples

    def load_splits(self) -> tuple[Dataset, Dataset, Dataset]:
        train, val, test = super().load_splits()
        if not self.hparams["pack"]:
            return train, val, test
        chats = [train[i] for i in range(len(train))]  # type: ignore[arg-type]
        packed = _Chats(pack_chats(chats, self.input_shape[0]))
        tokens = sum(len(x) for x, _ in chats)
        rank_zero_info(
            f"Packed the {len(chats)} training chats into {len(packed)} blocks of up to "
            f"{self.input_shape[0]} tokens ({tokens / len(packed):.0f} tokens a block)."
        )
        return packed, val, test

    def prompt_ids(self, text: str) -> Tensor:
        """A user turn as the model's template renders it, up to where the assistant's answer starts."""
        rendered = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
        return torch.tensor(self.tokenizer(rendered, add_special_tokens=False)["input_ids"][-self.input_shape[0] :])

    def load_predict_inputs(self, path: Path) -> Dataset:  # type: ignore[override]
        if path.suffix != ".txt" or not path.is_file():
            raise ConfigError(
                f"data.predict_path={str(path)!r}: expected a .txt file, a prompt (a user turn) per line."
            )
        prompts = path.read_text(encoding="utf-8").splitlines()
        if not prompts or not all(p.strip() for p in prompts):
            raise ConfigError(f"data.predict_path={str(path)!r}: every line must hold a prompt (none may be empty).")
        self.predict_columns = {"input": prompts}
        return _Chats([(self.prompt_ids(p), torch.tensor(-1)) for p in prompts])

    def predict_dataloader(self) -> DataLoader:
        # A prompt at a time: prompts differ in length, and padding them would need an attention mask that tells a
        # pad from the same id in the text (many chat models pad with their end-of-turn token).
        if self.predict_set is None:
            return super().predict_dataloader()
        return DataLoader(self.predict_set, batch_size=1)

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def run_files(self) -> dict[str, str]:
        return huggingface_tokenizer_file(
            self.tokenizer, self.pad_id, self.vocabulary, chat_template=self.tokenizer.chat_template
        )

    def show(self, sample: Tensor, ax: Any) -> None:
        ax.text(0.0, 1.0, self.decode(sample.tolist())[:300], va="top", family="monospace", fontsize=7, wrap=True)
        ax.set_axis_off()
