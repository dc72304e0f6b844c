"""The language-model example (project/tasks/language_model.py, project/data/text.py, project/gpt.py) beyond the
contract suite's checks of it: the bench's hand-written loop (nanoGPT's) replays its training."""

from pathlib import Path

import bench  # benchmarks/ (conftest puts it on the path)
import numpy as np
import pytest
from conftest import DIGITS


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


def test_the_bpe_is_learned_from_the_training_text_alone_and_decodes_exactly(tmp_path: Path, text_corpus: Path) -> None:
    """A BPE learned on the whole corpus would merge the test text's one word, repeated 300 times, into a token
    (seen: "Ġzyzzyva" with 512 ids); learned on the training range it has no token of it. Each split is encoded on
    its own and decodes back to its bytes: the three splits are the corpus, none lost, none shared. The vocabulary
    alone decodes (it is what the checkpoint keeps), as Hugging Face's own decoder does."""
    pytest.importorskip("tokenizers", reason="data.tokenizer=bpe needs the text extra")
    from project.data.text import TextDataModule
    from project.data.tokenizer import bpe, decode

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
    assert "zyzzyva" in decode(ids[slice(*ranges[2])].tolist(), dm.vocabulary)  # the word is in the test text
    sample = "naïve café — ✓ def f(x):\n    return x  # \x00\x7f"
    assert decode(dm.encode(sample), dm.vocabulary) == bpe(dm.tokenizer_json).decode(dm.encode(sample)) == sample
    assert len(dm.encode("    return self.hparams")) < len("    return self.hparams") / 2  # merges were learned


def test_a_bpe_run_predicts_from_its_copied_directory_without_the_corpus(tmp_path: Path, text_corpus: Path) -> None:
    """The BPE travels with the run: in the checkpoint (predict on prompts reads no corpus) and as the run's
    tokenizer.json, which Hugging Face tokenizers loads and encodes with as the run did."""
    import csv
    import shutil

    import torch

    tokenizers = pytest.importorskip("tokenizers", reason="data.tokenizer=bpe needs the text extra")
    from conftest import LANGUAGE_MODEL, fit

    from project.engine.cli import main

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


def test_the_language_models_sweep_minimises_val_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("optuna")
    from conftest import ROOT

    from project.engine.sweep.spec import check_against_cli, load

    monkeypatch.chdir(ROOT)  # the sweep file's configs are relative to the checkout; parsing writes nothing
    spec = load("configs/sweeps/language_model.yaml")
    check_against_cli(spec)  # every searched key at both ends of its range, as the CLI parses it
    assert (spec.metric, spec.direction) == ("val/loss", "minimize")  # the task's monitor, unless told otherwise
