"""The text examples' tokenizers. ``bytes`` (the default): a token is a byte, 256 ids named ``<0x41>``... as in
sentencepiece's byte fallback; nothing to train, ship or install. ``bpe``: a byte-level BPE (GPT-2's scheme) trained
on the training text by Hugging Face ``tokenizers`` (the ``text`` extra: the Rust trainer and encoder every
Hugging Face model ships with, which learns a 4k vocabulary from megabytes in seconds), kept as its JSON, which is
all that encoding needs.

Decoding needs only the vocabulary, the names of the ids, which the checkpoint keeps as the model's
``target_names``: a byte name is its byte, a byte-level BPE token is its characters read back through GPT-2's
byte-to-character table."""

from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from project.engine import ConfigError

BYTE_NAMES = [f"<0x{b:02X}>" for b in range(256)]
END_OF_TEXT = "<|endoftext|>"


def byte_level_chars() -> dict[int, str]:
    """GPT-2's byte -> character table (``bytes_to_unicode``): printable bytes stand for themselves, the others for
    the characters from U+0100 on, so that every token of a byte-level BPE is a printable string."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in chars:
            chars[b], extra = chr(256 + extra), extra + 1
    return chars


_BYTE_OF_CHAR = {c: b for b, c in byte_level_chars().items()}


def decode(ids: Iterable[int], vocabulary: list[str]) -> str:
    """Token ids back to text, up to the first ``<|endoftext|>``; a byte vocabulary's other special ids (``<pad>``)
    are skipped; invalid UTF-8 is shown as U+FFFD."""
    is_bytes = vocabulary[:256] == BYTE_NAMES
    out = bytearray()
    for i in ids:
        name = vocabulary[i]
        if name == END_OF_TEXT:
            break
        if not is_bytes:
            out.extend(_BYTE_OF_CHAR[c] for c in name)
        elif i < 256:
            out.append(i)
    return out.decode("utf-8", errors="replace")


def token_bytes(vocabulary: list[str]) -> list[int]:
    """How many bytes of text each id stands for: 1 for a byte, a byte-level BPE token's count of characters
    (each stands for one byte), 0 for ``<|endoftext|>`` and a byte vocabulary's other special ids."""
    if vocabulary[:256] == BYTE_NAMES:
        return [1] * 256 + [0] * (len(vocabulary) - 256)
    return [0 if name == END_OF_TEXT else len(name) for name in vocabulary]


def _tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError:
        raise ConfigError(
            "data.tokenizer='bpe' needs Hugging Face tokenizers, which is not installed: "
            "pip install -e '.[text]' (or use data.tokenizer=bytes, which needs nothing)."
        ) from None
    return tokenizers


def train_bpe(texts: Iterable[str], vocab_size: int) -> str:
    """A byte-level BPE of ``vocab_size`` ids learned from ``texts`` (id 0 is ``<|endoftext|>``, then the 256
    bytes, then the merges), as its JSON."""
    tk = _tokenizers()
    tokenizer = tk.Tokenizer(tk.models.BPE())
    tokenizer.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT],
        show_progress=False,
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),  # every byte has an id: no text is unknown
    )
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer.to_str()


@lru_cache(maxsize=4)
def bpe(tokenizer_json: str) -> Any:
    """The ``tokenizers.Tokenizer`` of a JSON (built once per process)."""
    return _tokenizers().Tokenizer.from_str(tokenizer_json)


def bpe_vocabulary(tokenizer_json: str) -> list[str]:
    """The names of the ids, in id order."""
    vocab = bpe(tokenizer_json).get_vocab(with_added_tokens=True)
    return sorted(vocab, key=vocab.__getitem__)
