"""Language modelling on a text corpus: a text file, or a folder of them (``suffixes``, searched recursively); by
default the Python standard library's own top-level modules (~4.7 MB of source, on every machine, nothing to
download).

The corpus is tokenised once into a file of token ids (uint16) in ``cache_dir``, read as a memory-mapped array
(nanoGPT's ``train.bin``): a corpus of gigabytes never sits in memory. The tokenizer is byte-level: the 256 byte
values plus ``<|endoftext|>``, which separates the files; nothing to train or ship, and the vocabulary (the names
``<0x41>``... as in sentencepiece's byte fallback) travels in the checkpoint as the model's ``target_names``, which
is all that decoding needs. The splits are contiguous ranges of the token stream, train first, then validation,
then test: no window of validation text lies inside the training text. A sample is a block of ``block_size``
tokens and its targets, the same block shifted by one; blocks do not overlap.

``predict`` reads prompts: a ``.txt`` file with one prompt per line, or a folder of ``.txt`` files (one prompt
each); a prompt longer than the block keeps its last ``block_size`` tokens. Without ``predict_path``, the prompts
are the first halves of the first 16 test blocks.
"""

import hashlib
import json
import os
import sysconfig
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from project.engine.datamodule import DataModule
from project.engine.errors import ConfigError

END_OF_TEXT = 256
VOCABULARY = [f"<0x{b:02X}>" for b in range(256)] + ["<|endoftext|>"]
PREDICT_PROMPTS = 16  # prompts taken from the test split when no predict_path is given


def encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def decode(ids: list[int], vocabulary: list[str]) -> str:
    """Token ids back to text, up to the first ``<|endoftext|>`` (invalid UTF-8 shown as U+FFFD)."""
    out = bytearray()
    for i in ids:
        name = vocabulary[i]
        if name == "<|endoftext|>":
            break
        out.append(int(name[3:5], 16))
    return out.decode("utf-8", errors="replace")


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

    def __init__(
        self,
        path: str | None = None,
        block_size: int = 128,
        suffixes: list[str] | None = None,
        cache_dir: str | None = None,
        *,
        val_fraction: float = 0.05,
        test_fraction: float = 0.05,
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
            val_fraction: the share of the token stream after the training text that is validation text.
            test_fraction: the share at the end of the stream that is test text.
            normalize: must stay false (token ids are not standardised).
            **engine: the loader and split settings of ``DataModule`` (batch_size, num_workers, ...).
        """
        super().__init__(val_fraction=val_fraction, test_fraction=test_fraction, normalize=normalize, **engine)
        if block_size < 1:
            raise ConfigError(f"data.block_size={block_size!r}: a block must hold at least one token.")
        self.target_names = list(VOCABULARY)
        self.vocabulary = list(VOCABULARY)
        self.input_shape = (block_size,)

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

    def token_file(self) -> Path:
        """The corpus as uint16 token ids, tokenised on first use (one file at a time, never all in memory)."""
        files = self._files()
        key = hashlib.sha1(json.dumps(["bytes", *((str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns)
                                                  for f in files)]).encode()).hexdigest()[:16]  # fmt: skip
        folder = Path(self.hparams["cache_dir"]) if self.hparams["cache_dir"] else default_cache_dir()
        target = folder / f"{key}.u16"
        if target.exists():
            return target
        folder.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(f".partial-{os.getpid()}")
        with open(partial, "wb") as out:
            for i, file in enumerate(files):
                if i:
                    out.write(np.array([END_OF_TEXT], dtype=np.uint16).tobytes())
                out.write(np.frombuffer(file.read_bytes(), dtype=np.uint8).astype(np.uint16).tobytes())
        os.replace(partial, target)  # whole or absent: another process tokenising the same corpus is harmless
        return target

    def load_splits(self) -> tuple[Dataset, Dataset, Dataset]:
        path = self.token_file()
        total = path.stat().st_size // 2
        block = self.input_shape[0]
        n_test = int(total * self.hparams["test_fraction"])
        n_val = int(total * self.hparams["val_fraction"])
        n_train = total - n_val - n_test
        splits = (Blocks(path, 0, n_train, block), Blocks(path, n_train, n_train + n_val, block),
                  Blocks(path, n_train + n_val, total, block))  # fmt: skip
        for name, split in zip(("train", "validation", "test"), splits, strict=True):
            if len(split) == 0:
                raise ConfigError(
                    f"data.path={self.hparams['path']!r}: the {name} text ({total} tokens in all) holds no block "
                    f"of data.block_size={block} tokens: use more text, a smaller block or a larger fraction."
                )
        return splits

    # ---- predict ------------------------------------------------------------------------------------------------

    def load_predict_inputs(self, path: Path) -> Dataset:  # type: ignore[override]
        if path.is_dir():
            files = sorted(path.rglob("*.txt"))
            texts = [f.read_text(encoding="utf-8", errors="replace") for f in files]
        elif path.suffix == ".txt":
            texts = path.read_text(encoding="utf-8", errors="replace").splitlines()
        else:
            raise ConfigError(f"data.predict_path={str(path)!r}: expected a .txt file (a prompt per line) or a folder "
                              "of .txt files (a prompt each).")  # fmt: skip
        if not texts:
            raise ConfigError(f"data.predict_path={str(path)!r} holds no prompt.")
        self.predict_columns = {"input": texts}
        block = self.input_shape[0]
        return Prompts([torch.tensor([END_OF_TEXT, *encode(t)][-block:]) for t in texts])

    def predict_dataloader(self) -> DataLoader:
        if self.predict_set is None:
            test = self._split("test")
            half = max(1, self.input_shape[0] // 2)
            prompts = [test[i][0][:half] for i in range(min(PREDICT_PROMPTS, len(test)))]  # type: ignore[arg-type]
            self.predict_set = Prompts(prompts)
            self.predict_columns = {"input": [decode(p.tolist(), VOCABULARY) for p in prompts]}
        return DataLoader(self.predict_set, batch_size=1)  # prompts differ in length: one at a time

    def run_files(self) -> dict[str, str]:
        """``tokenizer.json``: the byte-level tokenizer (a byte's id is its value), as plain JSON."""
        special = {"<|endoftext|>": END_OF_TEXT}
        tokenizer = {"kind": "bytes", "encoding": "utf-8", "special": special, "vocabulary": self.vocabulary}
        return {"tokenizer.json": json.dumps(tokenizer, indent=1)}

    def show(self, sample: Tensor, ax: Any) -> None:
        ax.text(0.0, 1.0, decode(sample.tolist(), VOCABULARY), va="top", family="monospace", fontsize=7, wrap=True)
        ax.set_axis_off()
