"""Language modelling on a text corpus: a text file, or a folder of them (``suffixes``, searched recursively); by
default the Python standard library's own top-level modules (~4.7 MB of source, on every machine, nothing to
download).

The corpus is tokenised once into a file of token ids (uint16) in ``cache_dir``, read as a memory-mapped array
(nanoGPT's ``train.bin``): a corpus of gigabytes never sits in memory. ``<|endoftext|>`` separates the files.
The tokenizer (``project/data/tokenizer.py``) is byte-level by default: the 256 byte values, nothing to train or
ship. ``tokenizer: bpe`` learns a byte-level BPE of ``vocab_size`` ids from the training text alone (Hugging Face
``tokenizers``, the ``text`` extra); its JSON travels in the checkpoint and as the run's ``tokenizer.json``, so
predict and export never need the corpus. Either way the vocabulary travels as the model's ``target_names``, which
is all that decoding needs. The splits are contiguous ranges of the byte stream, train first, then validation, then
test: no window of validation text lies inside the training text (with BPE each range is encoded on its own, cut
where a character starts). A sample is a block of ``block_size`` tokens and its targets, the same block shifted by
one; blocks do not overlap.

``predict`` reads prompts: a ``.txt`` file with one prompt per line, or a folder of ``.txt`` files (one prompt
each); a prompt longer than the block keeps its last ``block_size`` tokens. Without ``predict_path``, the prompts
are the first halves of the first 16 test blocks.
"""

import hashlib
import itertools
import json
import os
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from project.data.tokenizer import BYTE_NAMES, END_OF_TEXT, bpe, bpe_vocabulary, decode, train_bpe
from project.engine import ConfigError, DataModule

BYTE_END_OF_TEXT = 256  # <|endoftext|>'s id in the byte vocabulary (BPE's is 0)
VOCABULARY = [*BYTE_NAMES, END_OF_TEXT]
PREDICT_PROMPTS = 16  # prompts taken from the test split when no predict_path is given
CHUNK = 1 << 24  # the bytes tokenised at a time: a corpus file of any size in flat memory
PIECE = 1 << 20  # BPE reads and encodes a file in pieces of at most this many bytes, cut at a line's end

__all__ = ["TextDataModule", "decode"]


def default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "project" / "tokens"


class Blocks(Dataset):
    """Blocks of ``block_size`` (+1 for the shifted targets) of the token file's range [start, end)."""

    def __init__(self, path: Path, start: int, end: int, block_size: int) -> None:
        self.path, self.start, self.block_size = path, start, block_size
        self.count = max(0, (end - start - 1) // block_size)
        self._tokens: np.ndarray | None = None

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        if self._tokens is None:  # opened in each process that reads (a loader worker too): never pickled
            self._tokens = np.memmap(self.path, dtype=np.uint16, mode="r")
        offset = self.start + index * self.block_size
        window = torch.from_numpy(self._tokens[offset : offset + self.block_size + 1].astype(np.int64))
        return window[:-1], window[1:]

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_tokens": None}


class Prompts(Dataset):
    def __init__(self, prompts: list[Tensor]) -> None:
        self.prompts = prompts

    def __len__(self) -> int:
        return len(self.prompts)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        return self.prompts[index], torch.tensor(-1)


class TextDataModule(DataModule):
    """Blocks of a byte-tokenised corpus for next-token prediction."""

    input_dtype = torch.int64
    learned = (*DataModule.learned, "tokenizer_json")
    tokenizer_json: str | None = None  # the BPE (None: bytes)

    def __init__(
        self,
        path: str | None = None,
        block_size: int = 128,
        suffixes: list[str] | None = None,
        cache_dir: str | None = None,
        tokenizer: Literal["bytes", "bpe"] = "bytes",
        vocab_size: int = 4096,
        *,
        val_fraction: float = 0.05,
        test_fraction: float = 0.05,
        eval_samples: int | None = 4096,
        normalize: bool = False,
        **engine: Any,
    ) -> None:
        """
        Args:
            path: a text file or a folder of text files; None: the Python standard library's top-level modules.
            block_size: the tokens of one sample (the model's context).
            suffixes: the files of a folder that are read (default [".txt"]; [".py"] for the standard library).
            cache_dir: where the token file is kept (default ``$XDG_CACHE_HOME/project/tokens``, else
                ``~/.cache/project/tokens``); it is named by a hash of the files' paths, sizes and times, so an
                edited corpus is tokenised anew.
            tokenizer: ``bytes`` (a token per byte) or ``bpe`` (learned from the training text; needs the ``text``
                extra). A BPE token covers ~3-4 bytes of English or code: the same block sees more text.
            vocab_size: the BPE's ids, the 256 bytes and ``<|endoftext|>`` included (``bpe`` only).
            val_fraction: the share of the token stream after the training text that is validation text.
            test_fraction: the share at the end of the stream that is test text.
            eval_samples: the blocks a validation and the test read, evenly spaced over their text, the same every
                time: a corpus's splits grow with it, this does not (None: every block).
            normalize: must stay false (token ids are not standardised).
            **engine: the loader and split settings of ``DataModule`` (batch_size, num_workers, ...).
        """
        super().__init__(
            val_fraction=val_fraction,
            test_fraction=test_fraction,
            eval_samples=eval_samples,
            normalize=normalize,
            **engine,
        )
        if block_size < 1:
            raise ConfigError(f"data.block_size={block_size!r}: a block must hold at least one token.")
        if tokenizer not in ("bytes", "bpe"):  # jsonargparse checks the CLI's; this checks Python's callers
            raise ConfigError(f"data.tokenizer={tokenizer!r}: expected bytes or bpe.")
        if tokenizer == "bpe" and not 258 <= vocab_size <= 1 << 16:
            raise ConfigError(
                f"data.vocab_size={vocab_size!r}: a BPE holds the 256 bytes, <|endoftext|> and at "
                "least one merge (>= 258), and its ids are stored as uint16 (<= 65536)."
            )
        self.input_shape = (block_size,)
        if self.restored():  # the tokenizer and vocabulary from the checkpoint: the corpus is not read
            return
        if tokenizer == "bpe":
            self.tokenizer_json = self._learned_bpe()
        self.vocabulary = bpe_vocabulary(self.tokenizer_json) if self.tokenizer_json else list(VOCABULARY)
        self.target_names = list(self.vocabulary)

    @property
    def end_of_text(self) -> int:
        return 0 if self.tokenizer_json else BYTE_END_OF_TEXT

    def encode(self, text: str) -> list[int]:
        return bpe(self.tokenizer_json).encode(text).ids if self.tokenizer_json else list(text.encode("utf-8"))

    # ---- the corpus --------------------------------------------------------------------------------------------

    def _files(self) -> list[Path]:
        path, suffixes = self.hparams["path"], self.hparams["suffixes"]
        if path is None:
            root, suffixes = Path(sysconfig.get_paths()["stdlib"]), suffixes or [".py"]
            return sorted(p for p in root.iterdir() if p.suffix in suffixes and p.is_file())
        root = Path(path)
        if root.is_file():
            return [root]
        if not root.is_dir():
            raise ConfigError(f"data.path={path!r}: no such file or folder.")
        files = sorted(p for p in root.rglob("*") if p.suffix in (suffixes or [".txt"]) and p.is_file())
        if not files:
            raise ConfigError(f"data.path={path!r}: the folder holds no {suffixes or ['.txt']} files.")
        return files

    def _cached(self, kind: str, *extra: Any) -> Path:
        """The cache's name for ``kind`` of this corpus: a hash of the files' paths, sizes and times (and ``extra``)."""
        files = self._files()
        key = hashlib.sha1(
            json.dumps(
                [kind, *extra, *((str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in files)]
            ).encode()
        ).hexdigest()[:16]
        folder = Path(self.hparams["cache_dir"]) if self.hparams["cache_dir"] else default_cache_dir()
        folder.mkdir(parents=True, exist_ok=True)
        return folder / key

    def byte_file(self) -> Path:
        """The corpus as uint16 byte ids, tokenised on first use (in chunks of ``CHUNK`` bytes: a file of any size in
        flat memory)."""
        target = self._cached("bytes").with_suffix(".u16")
        if not target.exists():
            partial = target.with_suffix(f".partial-{os.getpid()}")
            with open(partial, "wb") as out:
                for i, file in enumerate(self._files()):
                    if i:
                        out.write(np.array([BYTE_END_OF_TEXT], dtype=np.uint16).tobytes())
                    with open(file, "rb") as f:
                        while chunk := f.read(CHUNK):
                            out.write(np.frombuffer(chunk, dtype=np.uint8).astype(np.uint16).tobytes())
            os.replace(partial, target)  # whole or absent: another process tokenising the same corpus is harmless
        return target

    def _byte_ranges(self) -> list[tuple[int, int]]:
        """(start, end) of train, validation and test in the byte stream."""
        total = self.byte_file().stat().st_size // 2
        n_test = int(total * self.hparams["test_fraction"])
        n_val = int(total * self.hparams["val_fraction"])
        n_train = total - n_val - n_test
        return [(0, n_train), (n_train, n_train + n_val), (n_train + n_val, total)]

    def _pieces(self, start: int, end: int) -> Iterator[tuple[bool, str]]:
        """The text of the byte range [start, end) in pieces, each with whether ``<|endoftext|>`` precedes it: a
        file's text (the stream is split at ``<|endoftext|>``), a long one in pieces of at most ``PIECE`` bytes cut
        after a newline. The range's ends are moved forward to where a character starts (a byte below 0x80 or a
        lead byte), so that no character is cut in two."""
        stream = np.memmap(self.byte_file(), dtype=np.uint16, mode="r")

        def starts_char(i: int) -> int:
            while i < len(stream) and 0x80 <= stream[i] < 0xC0:  # a UTF-8 continuation byte
                i += 1
            return i

        start, end = starts_char(start), starts_char(end)
        bounds = [start, *(start + np.flatnonzero(stream[start:end] == BYTE_END_OF_TEXT)), end]
        for a, b in itertools.pairwise(bounds):
            after = bool(a < b and stream[a] == BYTE_END_OF_TEXT)
            a += after
            while a < b:
                cut = b
                if b - a > PIECE:
                    newlines = np.flatnonzero(stream[a : a + PIECE] == 0x0A)
                    cut = a + int(newlines[-1]) + 1 if len(newlines) else starts_char(a + PIECE)
                yield after, stream[a:cut].astype(np.uint8).tobytes().decode("utf-8", errors="replace")
                a, after = cut, False

    def _learned_bpe(self) -> str:
        """The BPE learned from the training text (cached beside the token files: a resumed run reuses it)."""
        path = self._cached(
            "bpe", self.hparams["vocab_size"], self.hparams["val_fraction"], self.hparams["test_fraction"]
        ).with_suffix(".bpe.json")
        if not path.exists():
            partial = path.with_suffix(f".partial-{os.getpid()}")
            training_text = (text for _, text in self._pieces(*self._byte_ranges()[0]))
            partial.write_text(train_bpe(training_text, self.hparams["vocab_size"]))
            os.replace(partial, path)
        return path.read_text()

    def token_file(self) -> tuple[Path, list[tuple[int, int]]]:
        """The file of token ids (uint16) and the (start, end) of train, validation and test in it."""
        if not self.tokenizer_json:
            return self.byte_file(), self._byte_ranges()
        key = hashlib.sha1(self.tokenizer_json.encode()).hexdigest()[:16]
        target = self._cached("bpe-tokens", key).with_suffix(".u16")
        bounds = target.with_suffix(".ranges.json")
        if not bounds.exists():
            partial, ranges, count = target.with_suffix(f".partial-{os.getpid()}"), [], 0
            with open(partial, "wb") as out:
                for start, end in self._byte_ranges():  # each split encoded on its own: no token spans two
                    first = count
                    for after_end_of_text, piece in self._pieces(start, end):
                        ids = [self.end_of_text] * after_end_of_text + self.encode(piece)
                        out.write(np.array(ids, dtype=np.uint16).tobytes())
                        count += len(ids)
                    ranges.append((first, count))
            os.replace(partial, target)
            partial.write_text(json.dumps(ranges))
            os.replace(partial, bounds)  # last: where the ranges are, the ids are whole
        return target, [tuple(r) for r in json.loads(bounds.read_text())]  # type: ignore[misc]

    def load_splits(self) -> tuple[Dataset, Dataset, Dataset]:
        path, ranges = self.token_file()
        block = self.input_shape[0]
        splits = tuple(Blocks(path, start, end, block) for start, end in ranges)
        for name, split in zip(("train", "validation", "test"), splits, strict=True):
            if len(split) == 0:
                raise ConfigError(
                    f"data.path={self.hparams['path']!r}: the {name} text ({ranges[-1][1]} tokens in all) holds no "
                    f"block of data.block_size={block} tokens: use more text, a smaller block or a larger fraction."
                )
        return splits  # type: ignore[return-value]

    # ---- predict ------------------------------------------------------------------------------------------------

    def load_predict_inputs(self, path: Path) -> Dataset:  # type: ignore[override]
        if path.is_dir():
            files = sorted(path.rglob("*.txt"))
            texts = [f.read_text(encoding="utf-8", errors="replace") for f in files]
            names = [str(f) for f in files]
        elif path.suffix == ".txt":
            texts = path.read_text(encoding="utf-8", errors="replace").splitlines()
            names = [f"line {i}" for i in range(1, len(texts) + 1)]
        else:
            raise ConfigError(
                f"data.predict_path={str(path)!r}: expected a .txt file (a prompt per line) or a folder "
                "of .txt files (a prompt each)."
            )
        if not texts:
            raise ConfigError(f"data.predict_path={str(path)!r} holds no prompt.")
        if empty := [name for name, text in zip(names, texts, strict=True) if not text]:
            raise ConfigError(
                f"data.predict_path={str(path)!r}: {', '.join(empty[:3])} holds an empty prompt (it "
                "would generate from <|endoftext|> alone); remove it, or give it some text."
            )
        self.predict_columns = {"input": texts}
        # As model.json says (input_description): <|endoftext|> first, as before every text in training, and the
        # last block_size ids kept, the model's longest context.
        block = self.input_shape[0]
        return Prompts([torch.tensor([self.end_of_text, *self.encode(t)][-block:]) for t in texts])

    def input_description(self) -> dict[str, Any]:
        return {
            "prompt": {
                "prefix": [self.end_of_text],
                "keep_last": self.input_shape[0],
                "meaning": "a prompt's token ids follow the prefix (<|endoftext|>, which precedes every text "
                "in training); of those, the last keep_last are the input (longer ones are refused)",
            },
            "tokenizer_json": self.run_files()["tokenizer.json"],  # also the run's tokenizer.json
        }

    def predict_dataloader(self) -> DataLoader:
        if self.predict_set is None:
            test = self._split("test")
            half = max(1, self.input_shape[0] // 2)
            prompts = [test[i][0][:half] for i in range(min(PREDICT_PROMPTS, len(test)))]  # type: ignore[arg-type]
            self.predict_set = Prompts(prompts)
            self.predict_columns = {"input": [decode(p.tolist(), self.target_names) for p in prompts]}
        return DataLoader(self.predict_set, batch_size=1)  # prompts differ in length: one at a time

    def run_files(self) -> dict[str, str]:
        """``tokenizer.json``: the BPE as Hugging Face ``tokenizers`` writes it, or the byte-level tokenizer (a byte's
        id is its value) as plain JSON."""
        if self.tokenizer_json:
            return {"tokenizer.json": self.tokenizer_json}
        special = {END_OF_TEXT: BYTE_END_OF_TEXT}
        tokenizer = {"kind": "bytes", "encoding": "utf-8", "special": special, "vocabulary": self.vocabulary}
        return {"tokenizer.json": json.dumps(tokenizer, indent=1)}

    def show(self, sample: Tensor, ax: Any) -> None:
        text = decode(sample.tolist(), self.target_names)
        ax.text(0.0, 1.0, text, va="top", family="monospace", fontsize=7, wrap=True)
        ax.set_axis_off()
