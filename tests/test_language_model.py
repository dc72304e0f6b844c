"""The language-model example (project/tasks/language_model.py, project/data/text.py, project/gpt.py) beyond the
contract suite's checks of it: the bench's hand-written loop (nanoGPT's) replays its training."""

from pathlib import Path

import bench  # benchmarks/ (conftest puts it on the path)
import numpy as np
import pytest
from conftest import DIGITS


@pytest.mark.guarantee(
    "the hand-written reference loop and the template do the same work (the same val acc; the same val RMSE on a "
    "regression; the language model's trajectory)"
)
@pytest.mark.slow
def test_the_hand_written_loop_replays_the_language_model_too(
    tmp_path: Path, text_corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    from conftest import LANGUAGE_MODEL

    args = ["--config", LANGUAGE_MODEL, f"--data.path={text_corpus}", "--trainer.limit_train_batches=5"]
    monkeypatch.setitem(bench.WORKLOADS, "text", {"args": args, "epochs": 2})
    bench.write_spec(DIGITS, "text", 2, tmp_path / "spec.pt", limit=5)
    spec = torch.load(tmp_path / "spec.pt", weights_only=True)
    assert spec["tokens_per_sample"] == 32 and spec["flops_per_step"] > 0
    reference = bench.run_reference(tmp_path / "spec.pt")
    template = bench.run_template(DIGITS, "text", epochs=2, save_dir=str(tmp_path))
    assert reference["steps_per_epoch"] == template["steps_per_epoch"] == 5
    # The same trajectory (init, data order, dropout draws): the template's step is the sum of the token losses
    # over their count, the loop's their mean (nanoGPT's), equal in exact arithmetic; float32 rounds the two
    # reductions differently (~1e-7 relative), which 10 AdamW steps (each moving a weight by at most ~lr) keep
    # far below 1e-4 (a transformer amplifies it over hundreds of steps: 1.6e-3 after 174 measured, so the run is
    # short). A misweighted token or a lost step is O(1e-2).
    assert template["val_metric"] == pytest.approx(reference["val_metric"], rel=1e-4)


def _corpus_with_a_word_only_in_the_test_text(path: Path, text_corpus: Path) -> str:
    """The fixture's text, then "zyzzyva" 300 times as its last ~3 KB: the test range (5% of ~100 KB) holds it all."""
    text = text_corpus.read_text()[:60_000] + "\nnaïve café — ✓\n" + " zyzzyva" * 300
    path.write_text(text)
    return text


@pytest.mark.guarantee(
    "`data.tokenizer=bpe` is learned from the training range alone (a word only in the test text gets no token); "
    "the splits, each encoded on its own, decode back to the corpus; the vocabulary alone decodes",
)
@pytest.mark.guarantee(
    "`val/bpb` is the split's summed next-token loss in bits over the bytes of text its predicted tokens stand for "
    "(a byte 1, a BPE token its bytes, `<|endoftext|>` none), for bytes and a BPE alike, so it compares runs of "
    "different tokenizers; a split's tokens stand for exactly its text's bytes",
)
def test_the_bpe_is_learned_from_the_training_text_alone_and_decodes_exactly(tmp_path: Path, text_corpus: Path) -> None:
    """A BPE learned on the whole corpus would merge the test text's one word, repeated 300 times, into a token
    (seen: "Ġzyzzyva" with 512 ids); learned on the training range it has no token of it. Each split is encoded on
    its own and decodes back to its bytes: the three splits are the corpus, none lost, none shared. The vocabulary
    alone decodes (it is what the checkpoint keeps), as Hugging Face's own decoder does."""
    pytest.importorskip("tokenizers", reason="data.tokenizer=bpe needs the text extra")
    from project.data.text import TextDataModule
    from project.data.tokenizer import bpe, decode, token_bytes

    text = _corpus_with_a_word_only_in_the_test_text(tmp_path / "corpus.txt", text_corpus)
    dm = TextDataModule(str(tmp_path / "corpus.txt"), block_size=16, tokenizer="bpe", vocab_size=512,
                        cache_dir=str(tmp_path / "cache"))  # fmt: skip
    assert len(dm.vocabulary) == dm.num_outputs == 512 and dm.vocabulary[0] == "<|endoftext|>"
    assert not [name for name in dm.vocabulary if "zyz" in name]
    path, ranges = dm.token_file()
    ids = np.memmap(path, dtype=np.uint16, mode="r")
    assert ranges[0][0] == 0 and ranges[0][1] == ranges[1][0] and ranges[1][1] == ranges[2][0]
    assert ranges[2][1] == len(ids)
    assert "".join(decode(ids[a:b].tolist(), dm.vocabulary) for a, b in ranges) == text
    stands_for = token_bytes(dm.vocabulary)  # bits per byte divide by it: a split's tokens are its text's bytes
    for a, b in ranges:
        assert sum(stands_for[i] for i in ids[a:b].tolist()) == len(decode(ids[a:b].tolist(), dm.vocabulary).encode())
    assert "zyzzyva" in decode(ids[slice(*ranges[2])].tolist(), dm.vocabulary)  # the word is in the test text
    sample = "naïve café — ✓ def f(x):\n    return x  # \x00\x7f"
    assert decode(dm.encode(sample), dm.vocabulary) == bpe(dm.tokenizer_json).decode(dm.encode(sample)) == sample
    assert len(dm.encode("    return self.hparams")) < len("    return self.hparams") / 2  # merges were learned


@pytest.mark.guarantee(
    "`val/bpb` is the split's summed next-token loss in bits over the bytes of text its predicted tokens stand for "
    "(a byte 1, a BPE token its bytes, `<|endoftext|>` none), for bytes and a BPE alike, so it compares runs of "
    "different tokenizers; a split's tokens stand for exactly its text's bytes",
)
@pytest.mark.parametrize("tokenizer", ["bytes", "bpe"])
def test_bits_per_byte_are_the_summed_loss_over_the_bytes_of_the_predicted_text(
    tokenizer: str, tmp_path: Path, text_corpus: Path
) -> None:
    """val/bpb = the split's summed next-token loss in nats, over the bytes of text its counted targets stand for,
    / ln 2 (a byte: 1, a BPE token: its bytes, <|endoftext|>: 0): the same quantity whatever the tokenizer, where
    val/loss is per token (seen failing as val/loss / ln 2, which counts a BPE token as one byte)."""
    import math

    import torch
    from conftest import LANGUAGE_MODEL

    from project.engine import CLI

    if tokenizer == "bpe":
        pytest.importorskip("tokenizers", reason="data.tokenizer=bpe needs the text extra")
    args = [
        f"--data.path={text_corpus}",
        f"--data.tokenizer={tokenizer}",
        "--data.vocab_size=300",
        f"--data.cache_dir={tmp_path / 'cache'}",
        "--trainer.limit_val_batches=3",
        "--trainer.logger=false",
    ]
    cli = CLI(["validate", "--config", DIGITS, "--config", LANGUAGE_MODEL, *args])  # fmt: skip
    task, dm = cli.model.eval(), cli.datamodule
    nats, text_bytes = 0.0, 0
    with torch.no_grad():
        for _, (x, y) in zip(range(3), dm.val_dataloader(), strict=False):
            nats += task.loss(task(x), y).double().sum().item()  # no padding in a corpus's blocks
            end = y == dm.end_of_text
            text_bytes += (y[~end] < 256).sum().item() if tokenizer == "bytes" else int(task.token_bytes[y].sum())
    logged = float(cli.trainer.callback_metrics["val/bpb"])
    assert logged == pytest.approx(nats / text_bytes / math.log(2), rel=1e-6)  # float32 losses, summed in float64
    per_token = float(cli.trainer.callback_metrics["val/loss"]) / math.log(2)
    # A byte is a token (the corpus holds no <|endoftext|> to leave out); a BPE token stands for a byte or more.
    assert logged < per_token * 0.99 if tokenizer == "bpe" else logged == pytest.approx(per_token, rel=1e-6)


@pytest.mark.guarantee(
    "a prompt file is read as `model.json` says (`input.prompt`: `<|endoftext|>` first, the last `block_size` ids "
    "kept; `input.tokenizer_json`), so a program feeding the exported model builds the ids predict builds; a blank "
    "prompt is refused, naming its line",
)
def test_prompts_are_read_as_model_json_says_and_an_empty_one_is_refused(tmp_path: Path, text_corpus: Path) -> None:
    """What model.json tells a user of the exported model (the prefix, the ids kept, the tokenizer) is what predict
    does with a prompt file: a byte's id is its value; a blank line is refused, naming it, not generated from."""
    import json

    from project.data.text import TextDataModule
    from project.engine import ConfigError

    dm = TextDataModule(str(text_corpus), block_size=16, cache_dir=str(tmp_path / "cache"))
    said = dm.input_description()
    assert said["prompt"]["prefix"] == [256] and said["prompt"]["keep_last"] == 16
    assert json.loads(said["tokenizer_json"])["special"] == {"<|endoftext|>": 256}
    texts = ["def f(", "naïve café, and a prompt longer than the block"]
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(texts) + "\n")
    read = dm.load_predict_inputs(prompts)
    for text, (ids, _) in zip(texts, read, strict=True):
        assert ids.tolist() == [*said["prompt"]["prefix"], *text.encode()][-said["prompt"]["keep_last"] :]
    prompts.write_text("def f(\n\nclass A:\n\n")
    with pytest.raises(ConfigError, match="line 2, line 4 holds an empty prompt"):
        dm.load_predict_inputs(prompts)


@pytest.mark.guarantee(
    "a BPE run's tokenizer travels with the run: in the checkpoint (its copied run directory predicts on prompts "
    "without the corpus, as the run did) and as `tokenizer.json`, which Hugging Face `tokenizers` loads",
)
def test_a_bpe_run_predicts_from_its_copied_directory_without_the_corpus(tmp_path: Path, text_corpus: Path) -> None:
    """The BPE travels with the run: in the checkpoint (predict on prompts reads no corpus) and as the run's
    tokenizer.json, which Hugging Face tokenizers loads and encodes with as the run did."""
    import csv
    import shutil

    import torch

    tokenizers = pytest.importorskip("tokenizers", reason="data.tokenizer=bpe needs the text extra")
    from conftest import LANGUAGE_MODEL, fit

    from project.engine import main

    corpus = tmp_path / "corpus.txt"
    _corpus_with_a_word_only_in_the_test_text(corpus, text_corpus)
    cli = fit(tmp_path / "logs", f"--data.path={corpus}", "--data.tokenizer=bpe", "--data.vocab_size=300",
              "--trainer.max_epochs=1", "--trainer.limit_train_batches=3", "--trainer.limit_val_batches=2",
              "--trainer.limit_test_batches=2", configs=(DIGITS, LANGUAGE_MODEL))  # fmt: skip
    run = Path(cli.trainer.log_dir)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def main(\nnaïve café\n")
    given = [f"--data.predict_path={prompts}", "--model.temperature=0", "--model.max_new_tokens=5"]
    main(["predict", "--config", str(run / "config.yaml"), f"--ckpt_path={run / 'checkpoints' / 'best.ckpt'}", *given])
    predicted = (run / "predictions.csv").read_text()
    task, dm = cli.model, cli.datamodule
    task.load_state_dict(torch.load(run / "checkpoints" / "best.ckpt", weights_only=True)["state_dict"])
    task.eval().temperature, task.max_new_tokens = 0.0, 5
    for prompt, row in zip(prompts.read_text().splitlines(), csv.DictReader(predicted.splitlines()), strict=True):
        ids = torch.tensor([[dm.end_of_text, *dm.encode(prompt)]])  # the prompt as the training run's BPE reads it
        assert [row["generated"]] == task.prediction_table(task.generate(ids))[1][0]
    copy = tmp_path / "elsewhere"
    shutil.copytree(run, copy)
    corpus.rename(tmp_path / "gone.txt")
    shutil.rmtree(tmp_path / "logs")
    main(["predict", "--config", str(copy / "config.yaml"), f"--ckpt_path={copy / 'checkpoints' / 'best.ckpt'}",
          *given])  # fmt: skip
    assert (copy / "predictions.csv").read_text() == predicted
    saved = tokenizers.Tokenizer.from_file(str(copy / "tokenizer.json"))
    assert saved.encode("def main(").ids == cli.datamodule.encode("def main(")


@pytest.mark.guarantee(
    "the sweep optimises the task's metric in its direction unless the file names another (the language model's "
    "sweep: `val/loss`, min)"
)
def test_the_language_models_sweep_minimises_val_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("optuna")
    from conftest import ROOT

    from project.engine.sweep.spec import check_against_cli, load

    monkeypatch.chdir(ROOT)  # the sweep file's configs are relative to the checkout; parsing writes nothing
    spec = load("configs/sweeps/language_model.yaml")
    check_against_cli(spec)  # every searched key at both ends of its range, as the CLI parses it
    assert (spec.metric, spec.direction) == ("val/loss", "minimize")  # the task's monitor, unless told otherwise


@pytest.mark.guarantee(
    "a language model's validation and test read a bounded sample of their text (data.eval_samples blocks, evenly "
    "spaced, 4096 by default), however large the corpus; null reads every block"
)
def test_a_larger_corpus_evaluates_no_more_blocks(tmp_path: Path) -> None:
    from project.data.text import TextDataModule

    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(bytes(range(32, 127)) * 3000)  # 285,000 bytes: 5% is 14,250 bytes, 890 blocks of 16
    sizes = {}
    for limit in (100, None):
        dm = TextDataModule(str(corpus), block_size=16, cache_dir=str(tmp_path / "cache"), eval_samples=limit)
        dm.setup("fit")
        sizes[limit] = (len(dm.val_set), len(dm.val_dataloader().dataset), len(dm.test_dataloader().dataset))
    assert sizes == {100: (890, 100, 100), None: (890, 890, 890)}
    assert TextDataModule.__init__.__kwdefaults__["eval_samples"] == 4096


@pytest.mark.guarantee("the byte tokeniser reads a file in chunks: the ids are the file's bytes, whatever the chunk")
def test_the_byte_file_is_the_corpus_bytes_read_in_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import project.data.text as text

    (tmp_path / "corpus").mkdir()
    first, second = "naïve café\n" * 40, "def f():\n    return 1\n" * 30
    (tmp_path / "corpus" / "a.txt").write_text(first)
    (tmp_path / "corpus" / "b.txt").write_text(second)
    monkeypatch.setattr(text, "CHUNK", 7)  # many chunks, and characters cut between them
    dm = text.TextDataModule(str(tmp_path / "corpus"), block_size=16, cache_dir=str(tmp_path / "cache"))
    ids = np.fromfile(dm.byte_file(), dtype=np.uint16).tolist()
    assert ids == [*first.encode(), text.BYTE_END_OF_TEXT, *second.encode()]


def test_fsdp_shards_the_gpts_blocks_and_leaves_its_tied_head_to_the_net() -> None:
    from project.engine.model.sharding import units_of
    from project.gpt import GPT

    net = GPT((16,), 20, layers=3, heads=2, width=8)
    assert net.head.weight is net.tokens.weight
    assert units_of(net) == list(net.blocks)  # no ConfigError: the tied weight is in one group
