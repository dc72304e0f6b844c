"""Text classification: a CSV (with a header) or a JSON Lines file with a text column and a label column, e.g.
``configs/tasks/text_classification.yaml``. Classes are the label column's values, sorted (as ``CSVDataModule``
sorts them).

Tokens are bytes (256 ids) and ``<pad>`` (256): nothing to train or ship; or, with ``tokenizer``, a Hugging Face
tokenizer's (a pretrained model's own). A text longer than ``max_length`` tokens is truncated to
its first ``max_length``; a batch is padded to its longest text with the pad id, which the net masks out.
``predict`` reads a ``.txt`` file (a text per line) or a file like the training one (its text column).
"""

import csv
import functools
import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from project.data.tokenizer import BYTE_NAMES
from project.engine import ConfigError, DataModule

PAD = 256
VOCABULARY = [*BYTE_NAMES, "<pad>"]


def pad_batch(samples: list[tuple[Tensor, Tensor]], pad: int = PAD) -> tuple[Tensor, Tensor]:
    """Texts padded with ``pad`` to the batch's longest; their labels stacked."""
    texts, labels = zip(*samples, strict=True)
    return nn.utils.rnn.pad_sequence(list(texts), batch_first=True, padding_value=pad), torch.stack(list(labels))


class _Texts(Dataset):
    def __init__(self, ids: list[Tensor], labels: list[int] | list[list[float]]) -> None:
        self.ids, self.labels = ids, labels

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        return self.ids[index], torch.tensor(self.labels[index])


# What a tag column may hold (a CSV's text, or JSON's numbers and booleans as str() writes them).
_TAG_VALUES = {"0": 0.0, "1": 1.0, "0.0": 0.0, "1.0": 1.0, "False": 0.0, "True": 1.0, "false": 0.0, "true": 1.0}


def read_rows(path: Path, key: str) -> list[dict[str, Any]]:
    """The rows of a .csv (header) or .jsonl file, refused in one sentence naming ``key`` if the file is not one."""
    if not path.is_file():
        raise ConfigError(f"{key}={str(path)!r}: no such file.")
    if path.suffix == ".csv":
        with open(path, newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f))
    if path.suffix == ".jsonl":
        rows = []
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise ConfigError(f"{key}={str(path)!r}, line {number}: not JSON ({err.msg}).") from None
        return rows
    raise ConfigError(f"{key}={str(path)!r}: expected a .csv file with a header or a .jsonl file.")


def transformers_module() -> Any:
    try:
        import transformers
    except ImportError:
        raise ConfigError(
            "a Hugging Face model needs the hf extra: pip install -e '.[hf]' (or make install EXTRAS=hf)."
        ) from None
    transformers.logging.set_verbosity_error()  # its load report names the new head's weights "missing": by design
    transformers.logging.disable_progress_bar()
    return transformers


def pretrained_path(name_or_path: str, key: str, download: bool) -> str:
    """A local directory as given, or a hub id found in the local cache; one sentence naming what to fetch if not."""
    if Path(name_or_path).is_dir() or download:
        return name_or_path
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(name_or_path, local_files_only=True)
    except Exception:  # not in the cache (or not a hub id): huggingface_hub raises several kinds
        hub_id = name_or_path.count("/") == 1 and not name_or_path.startswith((".", "/", "~"))
        fetch = (
            f"; a hub id is fetched on a connected machine (hf download {name_or_path}) and its cache copied over"
            if hub_id
            else ""
        )
        raise ConfigError(
            f"{key}={name_or_path!r}: no such directory (one that save_pretrained wrote), nor a model in the local "
            f"Hugging Face cache{fetch}."
        ) from None


def huggingface_tokenizer_file(
    tokenizer: Any, pad_id: int, vocabulary: list[str] | None, **more: Any
) -> dict[str, str]:
    """``tokenizer.json`` of a run: the vocabulary in id order, the pad id and the Hugging Face tokenizer itself."""
    record = {
        "kind": "huggingface",
        "special": {"<pad>": pad_id},
        "vocabulary": vocabulary,
        **more,
        "tokenizer": json.loads(tokenizer.backend_tokenizer.to_str()),
    }
    return {"tokenizer.json": json.dumps(record, indent=1)}


class LabelledTextDataModule(DataModule):
    """Texts with a class each (or a 0/1 value per tag), split at random by ``split_seed``."""

    input_dtype = torch.int64

    def __init__(
        self,
        path: str,
        text: str = "text",
        label: str | list[str] = "label",
        max_length: int = 256,
        tokenizer: str | None = None,
        *,
        normalize: bool = False,
        **engine: Any,
    ) -> None:
        """
        Args:
            path: a .csv file (with a header) or a .jsonl file.
            text: the column (key) holding the text.
            label: the column (key) holding the class; or a list of columns holding 0 or 1 each, one per tag
                (multi-label: the targets of the MultiLabel task).
            max_length: tokens kept of each text (its first ones).
            tokenizer: a Hugging Face tokenizer (a directory or a hub id in the local cache: a pretrained model's
                own) instead of bytes.
            normalize: must stay false (token ids are not standardised).
            **engine: the loader and split settings of ``DataModule`` (batch_size, num_workers, ...).
        """
        super().__init__(normalize=normalize, **engine)
        if max_length < 1:
            raise ConfigError(f"data.max_length={max_length!r}: a text must keep at least one byte.")
        self.vocabulary, self.pad_id = list(VOCABULARY), PAD
        self._tokenizer = None
        if tokenizer is not None:
            where = pretrained_path(tokenizer, "data.tokenizer", download=False)
            self._tokenizer = transformers_module().AutoTokenizer.from_pretrained(where, local_files_only=True)
            if self._tokenizer.pad_token_id is None:
                raise ConfigError(f"data.tokenizer={tokenizer!r} has no pad token: a batch of texts needs one.")
            self.vocabulary = self._tokenizer.convert_ids_to_tokens(list(range(len(self._tokenizer))))
            self.pad_id = self._tokenizer.pad_token_id
        self.collate_fn = functools.partial(pad_batch, pad=self.pad_id)
        self.input_shape = (max_length,)
        if self.restored():  # the class names from the checkpoint: the file is not read
            return
        self._rows = read_rows(Path(path), "data.path")
        tags = [label] if isinstance(label, str) else list(label)
        for key, column in (("text", text), *(("label", tag) for tag in tags)):
            missing = next((i for i, row in enumerate(self._rows, 1) if column not in row), None)
            if missing is not None or not self._rows:
                raise ConfigError(f"data.{key}={column!r}: not a column of {path!r} (row {missing or 1}).")
        if isinstance(label, str):
            self.target_names = sorted({str(row[label]) for row in self._rows})
            if len(self.target_names) < 2:
                raise ConfigError(f"data.label={label!r}: {path!r} holds one class only ({self.target_names}).")
            return
        if not tags:
            raise ConfigError("data.label=[]: name the tag columns (a list of one or more columns holding 0 or 1).")
        self.target_kind, self.target_names = "values", tags
        for i, row in enumerate(self._rows, 1):
            if bad := next((tag for tag in tags if str(row[tag]).strip() not in _TAG_VALUES), None):
                raise ConfigError(
                    f"data.label: {path!r}, row {i}, column {bad!r} holds {row[bad]!r}; a tag column "
                    "holds 0 or 1 (true or false)."
                )

    def encode(self, text: str, where: str) -> Tensor:
        if not text:  # a text of no token: nothing for the net to read (and its mean over no token is undefined)
            raise ConfigError(f"{where}: an empty text; every text needs at least one character.")
        if self._tokenizer is not None:  # with the model's special tokens ([CLS] ... [SEP]), as it was pretrained
            ids = self._tokenizer(text, truncation=True, max_length=self.input_shape[0])["input_ids"]
            return torch.tensor(ids, dtype=torch.int64)
        return torch.tensor(list(text.encode("utf-8"))[: self.input_shape[0]], dtype=torch.int64)

    def decode(self, ids: list[int]) -> str:
        """Token ids back to text, padding and a tokenizer's special tokens left out."""
        if self._tokenizer is not None:
            return str(self._tokenizer.decode(ids, skip_special_tokens=True))
        return bytes(i for i in ids if i < PAD).decode("utf-8", errors="replace")

    def tokenizer_object(self) -> Any:
        """The Hugging Face tokenizer (``data.tokenizer``), for an export to transformers."""
        if self._tokenizer is None:
            raise ConfigError("this run's data has no Hugging Face tokenizer (data.tokenizer): its tokens are bytes.")
        return self._tokenizer

    def load_dataset(self) -> Dataset:
        column, label, path = self.hparams["text"], self.hparams["label"], self.hparams["path"]
        ids = [self.encode(str(r[column]), f"data.path={path!r}, row {i}") for i, r in enumerate(self._rows, 1)]
        _, _, test = self.split_indices(len(self._rows))
        self.test_columns = {"input": [str(self._rows[i][column]) for i in test]}  # the test split's predictions' texts
        if self.target_kind == "values":  # a 0/1 value per tag
            return _Texts(ids, [[_TAG_VALUES[str(r[tag]).strip()] for tag in label] for r in self._rows])
        index = {name: i for i, name in enumerate(self.target_names)}
        return _Texts(ids, [index[str(r[label])] for r in self._rows])

    def load_predict_inputs(self, path: Path) -> Dataset:  # type: ignore[override]
        if path.suffix == ".txt" and path.is_file():
            texts = path.read_text(encoding="utf-8").splitlines()
        else:
            rows = read_rows(path, "data.predict_path")
            column = self.hparams["text"]
            if any(column not in row for row in rows):
                raise ConfigError(f"data.predict_path={str(path)!r}: a row has no {column!r} column.")
            texts = [str(row[column]) for row in rows]
        if not texts:
            raise ConfigError(f"data.predict_path={str(path)!r} holds no text.")
        self.predict_columns = {"input": texts}
        where = f"data.predict_path={str(path)!r}"
        return _Texts([self.encode(t, f"{where}, text {i}") for i, t in enumerate(texts, 1)], [-1] * len(texts))

    def run_files(self) -> dict[str, str]:
        """``tokenizer.json``: the byte-level tokenizer (a byte's id is its value), or the Hugging Face one's own
        file, as plain JSON."""
        if self._tokenizer is not None:
            return huggingface_tokenizer_file(self._tokenizer, self.pad_id, self.vocabulary)
        tokenizer = {"kind": "bytes", "encoding": "utf-8", "special": {"<pad>": PAD}, "vocabulary": self.vocabulary}
        return {"tokenizer.json": json.dumps(tokenizer, indent=1)}

    def show(self, sample: Tensor, ax: Any) -> None:
        text = self.decode(sample.tolist())
        ax.text(0.0, 1.0, text[:200], va="top", family="monospace", fontsize=7, wrap=True)
        ax.set_axis_off()
