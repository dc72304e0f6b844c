"""Example data in the everyday shapes, to try ``configs/data/images.yaml``, ``configs/data/csv.yaml`` and
``configs/tasks/*.yaml``:

    python scripts/make_example_data.py  # data/images/{circle,square,triangle}/*.png, data/{table,regression,tags}.csv,
                                         # data/lines.csv, data/segmentation/{images,masks}/*.png + classes.txt,
                                         # data/tiny-bert/ (with the hf extra)

- images: RGB pictures of a circle, a square or a triangle of random size, position and colour on a noisy
  background, one subfolder per class (what ``ImageFolderDataModule`` reads);
- table: scikit-learn's breast-cancer table (569 rows, 30 numeric features, target ``diagnosis`` =
  benign/malignant), as a CSV file with a header (what ``CSVDataModule`` reads).
- regression: scikit-learn's diabetes table (442 rows, 10 numeric features in their own units, target
  ``progression``, a real number from 25 to 346), for ``configs/tasks/regression.yaml``;
- tags: 8 numeric features and 3 yes/no columns (``tag_a``, ``tag_b``, ``tag_c``), each a noisy linear rule of
  the features, for ``configs/tasks/multilabel.yaml``;
- lines: lines of the Python standard library's own source, each labelled ``code``, ``comment`` (a ``#`` line,
  without the ``#``) or ``docstring`` (the first line of a function's or class's docstring), 400 of each in random
  order, as a CSV with the columns ``text`` and ``label``, for ``configs/tasks/text_classification.yaml``;
- segmentation: 200 RGB pictures of 1 to 3 circles, squares and triangles on a noisy background, each with its
  mask of class indices (0 background, 1 circle, 2 square, 3 triangle) and ``classes.txt``, for
  ``configs/tasks/segmentation.yaml`` (what ``SegmentationFolderDataModule`` reads);
- tiny-bert: a tiny BERT with random weights and a WordPiece tokenizer learned from the lines, saved as a
  pretrained model is, for ``configs/tasks/hf_text_classification.yaml`` offline (with the ``hf`` extra).
It writes the data of the examples this repository has (scripts/shipped_examples.json); the tests use the
same functions with small sizes.
"""

import argparse
import csv
from collections import Counter
from pathlib import Path

import numpy as np

SHAPES = ("circle", "square", "triangle")


def write_shapes(root: str | Path, per_class: int = 200, size: int = 32, seed: int = 0) -> Path:
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    root = Path(root)
    for name in SHAPES:
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            background = rng.integers(128, 256, 3)  # a light background, a dark shape of any hue
            noise = rng.normal(0, 12, (size, size, 3))
            image = Image.fromarray(np.clip(background + noise, 0, 255).astype(np.uint8), "RGB")
            draw = ImageDraw.Draw(image)
            r = rng.uniform(0.25, 0.45) * size
            cx, cy = rng.uniform(r, size - r, 2)
            colour = tuple(int(c) for c in rng.integers(0, 100, 3))
            if name == "circle":
                draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=colour)
            elif name == "square":
                draw.rectangle((cx - r, cy - r, cx + r, cy + r), fill=colour)
            else:
                draw.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=colour)
            image.save(root / name / f"{i:04d}.png")
    return root


def write_segmentation(root: str | Path, count: int = 200, size: int = 32, seed: int = 0) -> Path:
    """``count`` RGB pictures of 1 to 3 shapes (circles, squares, triangles: classes 1-3, the background 0) of random
    size, position and colour on a noisy background, with their masks of class indices and classes.txt."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    root = Path(root)
    (root / "images").mkdir(parents=True, exist_ok=True)
    (root / "masks").mkdir(parents=True, exist_ok=True)
    (root / "classes.txt").write_text("\n".join(("background", *SHAPES)) + "\n")
    for i in range(count):
        noise = rng.normal(0, 12, (size, size, 3))
        image = Image.fromarray(np.clip(rng.integers(128, 256, 3) + noise, 0, 255).astype(np.uint8), "RGB")
        mask = Image.new("L", (size, size), 0)
        for _ in range(rng.integers(1, 4)):  # later shapes cover earlier ones, in the mask as in the picture
            label = int(rng.integers(1, len(SHAPES) + 1))
            r = rng.uniform(0.12, 0.3) * size
            cx, cy = rng.uniform(r, size - r, 2)
            colour = tuple(int(c) for c in rng.integers(0, 100, 3))
            for canvas, fill in ((ImageDraw.Draw(image), colour), (ImageDraw.Draw(mask), label)):
                if SHAPES[label - 1] == "circle":
                    canvas.ellipse((cx - r, cy - r, cx + r, cy + r), fill=fill)
                elif SHAPES[label - 1] == "square":
                    canvas.rectangle((cx - r, cy - r, cx + r, cy + r), fill=fill)
                else:
                    canvas.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=fill)
        image.save(root / "images" / f"{i:04d}.png")
        mask.save(root / "masks" / f"{i:04d}.png")
    return root


def write_breast_cancer(path: str | Path, rows: int | None = None) -> Path:
    from sklearn.datasets import load_breast_cancer

    table = load_breast_cancer()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*(n.replace(" ", "_") for n in table.feature_names), "diagnosis"])
        for x, y in list(zip(table.data, table.target, strict=True))[:rows]:
            writer.writerow([*(f"{v:.6g}" for v in x), table.target_names[y]])
    return path


def write_diabetes(path: str | Path) -> Path:
    from sklearn.datasets import load_diabetes

    table = load_diabetes(scaled=False)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*table.feature_names, "progression"])
        for x, y in zip(table.data, table.target, strict=True):
            writer.writerow([*(f"{v:.6g}" for v in x), f"{y:g}"])
    return path


def write_tags(path: str | Path, rows: int = 600, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(rows, 8))
    tags = (features @ rng.normal(size=(8, 3)) + rng.normal(0, 0.5, (rows, 3))) > 0
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*(f"x{i}" for i in range(8)), "tag_a", "tag_b", "tag_c"])
        for x, t in zip(features, tags, strict=True):
            writer.writerow([*(f"{v:.6g}" for v in x), *(int(v) for v in t)])
    return path


def write_lines(path: str | Path, per_class: int = 400, seed: int = 0) -> Path:
    import ast
    import random
    import sysconfig

    found: dict[str, list[str]] = {"code": [], "comment": [], "docstring": []}
    for module in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        source = module.read_text(encoding="utf-8", errors="replace")
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.ClassDef) and (doc := ast.get_docstring(node)):
                found["docstring"].append(doc.strip().splitlines()[0])
        for line in source.splitlines():
            text = line.strip()
            if text.startswith("#") and len(text.lstrip("#! ")) > 3:
                found["comment"].append(text.lstrip("#! "))  # without its mark: told from prose by its style
            elif len(text) > 3 and not text.startswith(('"', "'")) and "=" in text:
                found["code"].append(text)
        if all(len(v) >= 5 * per_class for v in found.values()):
            break
    rng = random.Random(seed)
    rows = [(text, label) for label, texts in found.items() for text in rng.sample(texts, per_class)]
    rng.shuffle(rows)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        writer.writerows(rows)
    return path


def write_tiny_encoder(
    path: str | Path, texts: list[str], seed: int = 0, layers: int = 2, width: int = 32, vocab_size: int = 500
) -> Path:
    """A tiny BERT and its WordPiece tokenizer learned from ``texts``, saved as a pretrained model is
    (``save_pretrained``): for ``configs/tasks/hf_text_classification.yaml`` where nothing can be downloaded. Its
    weights are random: a stand-in for a real checkpoint such as ``google-bert/bert-base-uncased``."""
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import AutoModel, BertConfig, PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    normalizer, pre_tokenizer = normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer()
    # The vocabulary is made here, not by tokenizers' WordPieceTrainer, whose choice among pieces of equal count
    # changes from run to run: the same texts give the same ids, so a model trained on them learns the same way.
    # Every character and its ##continuation (any word splits into known pieces), then the most frequent words.
    words = Counter(w for text in texts for w, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text)))
    chars = sorted({c for word in words for c in word})
    pieces = [*specials, *chars, *(f"##{c}" for c in chars)]
    frequent = [w for w, _ in sorted(words.items(), key=lambda item: (-item[1], item[0])) if len(w) > 1]
    vocab = pieces + frequent[: max(0, vocab_size - len(pieces))]
    tokenizer = Tokenizer(models.WordPiece({piece: i for i, piece in enumerate(vocab)}, unk_token="[UNK]"))
    tokenizer.normalizer, tokenizer.pre_tokenizer = normalizer, pre_tokenizer
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    hf_tokenizer = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]",
                                           cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")  # fmt: skip
    config = BertConfig(vocab_size=len(hf_tokenizer), hidden_size=width, num_hidden_layers=layers,
                        num_attention_heads=2, intermediate_size=2 * width, max_position_embeddings=512,
                        pad_token_id=hf_tokenizer.pad_token_id)  # fmt: skip
    torch.manual_seed(seed)
    path = Path(path)
    AutoModel.from_config(config).save_pretrained(path)
    hf_tokenizer.save_pretrained(path)
    return path


# ChatML, as Qwen's instruct models render a chat (no {% generation %} markers: the assistant's tokens are found by
# rendering the chat with and without each answer).
CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def write_chats(path: str | Path, count: int = 400, seed: int = 0) -> Path:
    """Chats in JSON Lines (``messages``), each a small task a model can learn from its answers alone: spell a word
    backwards, in capitals, or count its letters; a third of them with a system turn, a few with two rounds."""
    import json
    import random

    rng = random.Random(seed)
    words = ["apple", "river", "stone", "cloud", "tiger", "piano", "lemon", "candle", "garden", "rocket", "silver",
             "window", "pencil", "forest", "orange", "planet", "bridge", "castle", "dragon", "island"]  # fmt: skip
    tasks = [("Spell {w} backwards.", lambda w: w[::-1]), ("Write {w} in capitals.", str.upper),
             ("How many letters are in {w}?", lambda w: str(len(w)))]  # fmt: skip

    def turn() -> list[dict[str, str]]:
        question, answer = rng.choice(tasks)
        word = rng.choice(words)
        return [{"role": "user", "content": question.format(w=word)}, {"role": "assistant", "content": answer(word)}]

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(count):
            messages = [{"role": "system", "content": "Answer in one word."}] if i % 3 == 0 else []
            messages += turn() + (turn() if i % 7 == 0 else [])
            f.write(json.dumps({"messages": messages}) + "\n")
    return path


def write_tiny_chat_model(
    path: str | Path, texts: list[str], seed: int = 0, layers: int = 2, width: int = 32, tied: bool = False
) -> Path:
    """A tiny Llama and its byte-level BPE tokenizer learned from ``texts``, with a ChatML chat template, saved as a
    pretrained model is: for ``configs/tasks/sft.yaml`` where nothing can be downloaded (a stand-in for a real
    instruct model such as ``Qwen/Qwen2.5-0.5B-Instruct``; its weights are random)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tokenizer.train_from_iterator(texts, trainer)
    hf_tokenizer = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>",
                                           pad_token="<|endoftext|>", chat_template=CHATML)  # fmt: skip
    config = LlamaConfig(vocab_size=len(hf_tokenizer), hidden_size=width, intermediate_size=2 * width,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, pad_token_id=hf_tokenizer.pad_token_id,
                         eos_token_id=hf_tokenizer.eos_token_id, tie_word_embeddings=tied)  # fmt: skip
    torch.manual_seed(seed)
    path = Path(path)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(path)
    hf_tokenizer.save_pretrained(path)
    return path


def main(argv: list[str] | None = None) -> None:
    from shipped_examples import present  # beside this file

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="data", help="folder to write images/, segmentation/ and the CSV files into")
    parser.add_argument("--per-class", type=int, default=200)
    parser.add_argument("--size", type=int, default=32)
    args = parser.parse_args(argv)
    out = Path(args.out)
    # Only the data of the examples this repository has (make new-project KEEP=... leaves the others out).
    writers = {
        "images": lambda: f"{write_shapes(out / 'images', args.per_class, args.size)}/",
        "table": lambda: write_breast_cancer(out / "table.csv"),
        "regression": lambda: write_diabetes(out / "regression.csv"),
        "multilabel": lambda: write_tags(out / "tags.csv"),
        "text_classification": lambda: write_lines(out / "lines.csv"),
        "segmentation": lambda: f"{write_segmentation(out / 'segmentation', size=args.size)}/",
    }
    for example, write in writers.items():
        if present(example):
            print(f"Wrote {write()}")
    if not present("hf"):  # sft builds on hf: neither is here
        return
    try:  # the hf extra's
        import transformers  # noqa: F401
    except ImportError:
        print("(data/tiny-bert and data/tiny-chat not written: they need the hf extra, pip install -e '.[hf]')")
        return
    if present("hf"):
        with open(out / "lines.csv", encoding="utf-8") as f:  # hf builds on text_classification: lines.csv is there
            texts = [row["text"] for row in csv.DictReader(f)]
        print(f"Wrote {write_tiny_encoder(out / 'tiny-bert', texts)}/")
    if present("sft"):
        chats = write_chats(out / "chats.jsonl")
        prompts = out / "prompts.txt"  # for make predict INPUT=...: a user turn per line
        prompts.write_text("Spell tiger backwards.\nWrite garden in capitals.\nHow many letters are in planet?\n")
        print(f"Wrote {chats} and {prompts}")
        # 64 wide: QLoRA's 4-bit blocks (bitsandbytes) hold 64 weights along a layer's inputs.
        tiny_chat = write_tiny_chat_model(out / "tiny-chat", chats.read_text().splitlines(), width=64)
        print(f"Wrote {tiny_chat}/")


if __name__ == "__main__":
    main()
