"""The Hugging Face example (project/hf.py, configs/tasks/hf_text_classification.yaml): a pretrained encoder as the
Classifier's net, fine-tuned fully or with LoRA, and exported back to transformers. The pretrained model is a tiny
BERT with a WordPiece tokenizer, built here and saved as a real checkpoint is (nothing can be downloaded)."""

import csv
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import DIGITS, PYTHONPATH, fit, scalars
from conftest import HF_TEXT_CLASSES as HF

from project.engine import ConfigError
from project.engine.checkpointing.last_checkpoint import Interrupted

pytest.importorskip("transformers", reason="the hf extra is not installed (make install EXTRAS=hf)")
pytest.importorskip("peft", reason="the hf extra is not installed (make install EXTRAS=hf)")

SHORT = ("--trainer.max_epochs=8", "--trainer.log_every_n_steps=1")


def _given(lines_csv: Path, tiny_bert: Path) -> tuple[str, ...]:
    return (f"--data.path={lines_csv}", f"--data.tokenizer={tiny_bert}",
            f"--model.net.init_args.name_or_path={tiny_bert}")  # fmt: skip


def _batch(lines_csv: Path, tiny_bert: Path, n: int = 12) -> tuple[torch.Tensor, torch.Tensor, int]:
    from project.data import LabelledTextDataModule

    data = LabelledTextDataModule(path=str(lines_csv), tokenizer=str(tiny_bert), max_length=48)
    with open(lines_csv, encoding="utf-8") as f:
        rows = list(csv.DictReader(f))[:n]
    ids = [data.encode(row["text"], "row") for row in rows]
    labels = [data.target_names.index(row["label"]) for row in rows]
    x, y = data.collate_fn(list(zip(ids, torch.tensor(labels), strict=True)))
    return x, y, data.pad_id


@pytest.mark.guarantee(
    "a Hugging Face encoder as the Classifier's net: the loss on a batch is transformers' own `outputs.loss` on the "
    "same model and data, and padding changes no text's logits (the net masks the tokenizer's pad id)",
)
def test_the_loss_is_transformers_own_and_padding_changes_nothing(lines_csv: Path, tiny_bert: Path) -> None:
    from transformers import AutoModelForSequenceClassification

    from project.hf import HFClassifier
    from project.tasks import Classifier

    x, y, pad = _batch(lines_csv, tiny_bert)
    assert (x == pad).any(), "the batch must hold padding for this test to mean anything"
    torch.manual_seed(0)  # the new head's initialisation, the same in both
    net = HFClassifier((48,), 3, str(tiny_bert))
    # from_pretrained returns eval mode, which Lightning would keep for the whole run: dropout off.
    assert all(module.training for module in net.modules())
    task = Classifier(net=net, target_names=["a", "b", "c"]).eval()
    torch.manual_seed(0)
    reference = AutoModelForSequenceClassification.from_pretrained(
        tiny_bert, num_labels=3, dtype=torch.float32, ignore_mismatched_sizes=True
    ).eval()
    with torch.no_grad():
        ours = task.loss(task(x), y).mean()
        theirs = reference(input_ids=x, attention_mask=(x != pad).long(), labels=y).loss
        # The same model, weights and ops: equal up to float32 rounding of the mean's summation order.
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)
        alone = torch.cat([task(x[i : i + 1, : int((x[i] != pad).sum())]) for i in range(len(x))])
        # Padding masked out: only the reductions' order changes with the padded length (float32: ~1e-6).
        torch.testing.assert_close(task(x), alone, rtol=1e-5, atol=1e-5)


@pytest.mark.guarantee(
    "a model that is not a local directory nor in the local Hugging Face cache is refused in one sentence naming "
    "the key (nothing is downloaded unless asked), and a net whose pad id, size or tokenizer is not the data's is "
    "refused",
)
def test_a_missing_model_and_a_pad_id_the_data_does_not_use_are_refused(
    lines_csv: Path, tiny_bert: Path, tmp_path: Path
) -> None:
    from project.hf import HFClassifier

    with pytest.raises(ConfigError, match=r"model\.net\.init_args\.name_or_path='.*nope': no such directory"):
        HFClassifier((8,), 2, str(tmp_path / "nope"))
    bytes_data = ("--data.tokenizer=null",)  # byte tokens, padded with 256; the model pads with its own id
    with pytest.raises(ConfigError, match=r"takes id 0 for padding, but the data pads with 256"):
        fit(tmp_path, *_given(lines_csv, tiny_bert), *bytes_data, *SHORT, configs=(DIGITS, HF))
    from make_example_data import write_tiny_encoder

    small = write_tiny_encoder(tmp_path / "small-bert", ["a tiny corpus", "of two texts"])  # a few dozen tokens
    another = (f"--model.net.init_args.name_or_path={small}",)  # the data keeps tiny_bert's tokenizer (500 ids)
    with pytest.raises(ConfigError, match=r"embeds \d+ token ids, but the data's tokenizer has \d+"):
        fit(tmp_path, *_given(lines_csv, tiny_bert), *another, *SHORT, configs=(DIGITS, HF))
    # Another model of the same size and pad id, whose tokenizer learned other words: each id means another token.
    with open(lines_csv, encoding="utf-8") as f:
        backwards = [row["text"][::-1] for row in csv.DictReader(f)]
    other = write_tiny_encoder(tmp_path / "other-bert", backwards)
    assert other != tiny_bert
    mixed = (f"--model.net.init_args.name_or_path={other}",)
    with pytest.raises(ConfigError, match=r"the data's tokenizer is not model\.net's: token id \d+ is .* in the "):
        fit(tmp_path, *_given(lines_csv, tiny_bert), *mixed, *SHORT, configs=(DIGITS, HF))


def _logits_in_a_fresh_process(directory: Path, texts: list[str], adapter_of: Path | None = None) -> torch.Tensor:
    """What plain transformers (and peft, for an adapter) computes from an exported directory: no project code."""
    script = (
        "import sys, torch\n"
        "from transformers import AutoModelForSequenceClassification, AutoTokenizer\n"
        "directory, out, base = sys.argv[1], sys.argv[2], sys.argv[3]\n"
        "texts = sys.argv[4:]\n"
        "tokenizer = AutoTokenizer.from_pretrained(directory)\n"
        "if base:\n"
        "    from peft import PeftModel\n"
        "    model = AutoModelForSequenceClassification.from_pretrained(base, num_labels=3, dtype=torch.float32)\n"
        "    model = PeftModel.from_pretrained(model, directory)\n"
        "else:\n"
        "    model = AutoModelForSequenceClassification.from_pretrained(directory, dtype=torch.float32)\n"
        "batch = tokenizer(texts, padding=True, truncation=True, max_length=48, return_tensors='pt')\n"
        "with torch.no_grad():\n"
        "    torch.save(model.eval()(**batch).logits, out)\n"
    )
    out = directory.parent / f"logits-{directory.name}.pt"
    subprocess.run([sys.executable, "-c", script, str(directory), str(out), str(adapter_of or ""), *texts],
                   check=True, env={"PYTHONPATH": PYTHONPATH, "HF_HUB_OFFLINE": "1", "PATH": ""},
                   capture_output=True, timeout=240)  # fmt: skip
    return torch.load(out)


def _checkpoint_logits(run: Path, texts: list[str]) -> tuple[torch.Tensor, list[str]]:
    from project.engine import load_run

    model, data = load_run(run / "checkpoints" / "best.ckpt", read_data=False)
    x, _ = data.collate_fn([(data.encode(t, "text"), torch.tensor(0)) for t in texts])
    with torch.no_grad():
        return model.eval()(x), list(data.target_names)


@pytest.mark.guarantee(
    "full fine-tuning of a Hugging Face encoder learns (val acc well above chance on three classes), and its export "
    "loads back into plain transformers in a fresh process with the same logits and the class names in its config",
)
@pytest.mark.slow
def test_full_fine_tuning_learns_and_its_export_is_the_same_model_in_transformers(
    lines_csv: Path, tiny_bert: Path, tmp_path: Path
) -> None:
    from transformers import AutoConfig

    from project.hf import save_pretrained

    cli = fit(tmp_path, *_given(lines_csv, tiny_bert), *SHORT, configs=(DIGITS, HF))
    assert cli.trainer.checkpoint_callback.best_model_score > 0.55  # val/acc; chance is 1/3
    run = Path(cli.trainer.log_dir)
    out = save_pretrained(run)
    assert not (out / "adapter").exists()
    texts = ["x = compute(y)", "Return the sum of the two numbers.", "why this is needed here"]
    ours, names = _checkpoint_logits(run, texts)
    theirs = _logits_in_a_fresh_process(out / "model", texts)
    torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=1e-6)  # the same weights and ops, another process
    config = AutoConfig.from_pretrained(out / "model")
    assert config.id2label == dict(enumerate(names)) and config.problem_type == "single_label_classification"


@pytest.mark.guarantee(
    "LoRA fine-tuning trains only the adapters and the head (the base's weights end as they began; the trainable "
    "count is peft's); the adapter alone, loaded by peft onto the base in a fresh process, gives the run's logits, "
    "and the merged model gives them within 1e-4 of their scale",
)
@pytest.mark.slow
def test_the_ema_of_a_lora_fine_tune_copies_only_the_adapters_and_its_best_checkpoint_loads(
    lines_csv: Path, tiny_bert: Path, tmp_path: Path
) -> None:
    from project.engine import EMA, load_run

    lora = ("--model.net.init_args.lora={r: 4, alpha: 8, dropout: 0.0}", "--trainer.callbacks+=project.engine.EMA")
    cli = fit(tmp_path, *_given(lines_csv, tiny_bert), "--trainer.max_epochs=2", *lora, configs=(DIGITS, HF))
    task = cli.model
    average = next(cb for cb in cli.trainer.callbacks if isinstance(cb, EMA))._average_model.module
    frozen = [name for name, p in task.named_parameters() if not p.requires_grad]
    assert frozen and len(frozen) < len(list(task.parameters()))  # the base frozen, the adapters trained
    for name, p in task.named_parameters():  # the base is the task's own in the average, the adapters copies
        assert (average.get_parameter(name) is p) == (name in frozen), name
    model, _ = load_run(Path(cli.trainer.log_dir) / "checkpoints" / "best.ckpt", read_data=False)
    assert type(model) is type(task)


def test_lora_trains_only_the_adapters_and_exports_the_adapter_and_the_merged_model(
    lines_csv: Path, tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from safetensors.torch import load_file

    from project.hf import save_pretrained

    lora = ("--model.net.init_args.lora={r: 4, alpha: 8, dropout: 0.0}", "--model.optimizer.init_args.lr=0.01")
    cli = fit(tmp_path, *_given(lines_csv, tiny_bert), *SHORT, *lora, configs=(DIGITS, HF))
    peft_model = cli.model.net.model
    trainable, _ = peft_model.get_nb_trainable_parameters()
    assert f"LoRA: {trainable:,} of" in capsys.readouterr().out
    base = load_file(tiny_bert / "model.safetensors")
    trained = dict(peft_model.base_model.model.named_parameters())
    for name, tensor in base.items():  # the encoder's every weight, frozen: bitwise as pretrained
        key = f"bert.{name}" if f"bert.{name}" in trained else f"bert.{name}".replace(".weight", ".base_layer.weight")
        key = key if key in trained else key.replace(".bias", ".base_layer.bias")
        assert torch.equal(trained[key].detach(), tensor), name
    run = Path(cli.trainer.log_dir)
    out = save_pretrained(run)
    texts = ["x = compute(y)", "Return the sum of the two numbers.", "why this is needed here"]
    ours, _ = _checkpoint_logits(run, texts)
    adapter = _logits_in_a_fresh_process(out / "adapter", texts, adapter_of=tiny_bert)
    torch.testing.assert_close(adapter, ours, rtol=1e-5, atol=1e-6)
    merged = _logits_in_a_fresh_process(out / "model", texts)
    # Merging adds B·A into each base weight: float32 rounding of those sums, peft's own tolerance (1e-4).
    assert (merged - ours).abs().max() <= 1e-4 * max(1.0, ours.abs().max().item())
    assert not torch.equal(F.softmax(ours, -1), F.softmax(torch.zeros_like(ours), -1))  # a trained head


@pytest.mark.guarantee(
    "a LoRA run's checkpoints hold what trains (the adapters and the new head) and its optimizer state, not the "
    "frozen base, which is the pretrained model's (its path and weights' hash in provenance.json); a LoRA run "
    "resumed from such a checkpoint ends bitwise as the uninterrupted one",
)
@pytest.mark.slow
def test_a_lora_checkpoint_holds_what_trains_and_resumes_bitwise(
    lines_csv: Path, tiny_bert: Path, tmp_path: Path
) -> None:
    import hashlib
    import json

    lora = ("--model.net.init_args.lora={r: 4, alpha: 8, dropout: 0.1}", "--trainer.limit_train_batches=4",
            "--trainer.limit_val_batches=2", "--trainer.log_every_n_steps=1")  # fmt: skip
    straight = fit(tmp_path / "a", *_given(lines_csv, tiny_bert), *lora, "--trainer.max_epochs=2", configs=(DIGITS, HF))
    net = straight.model.net
    trains = {f"net.{n}" for n, p in net.named_parameters() if p.requires_grad}
    run = Path(straight.trainer.log_dir)
    saved = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    buffers = {f"net.{n}" for n, _ in net.named_buffers()}
    assert trains <= set(saved["state_dict"]) <= trains | buffers  # no frozen weight of the base
    total = sum(p.numel() for p in net.parameters())
    kept = sum(saved["state_dict"][k].numel() for k in trains)
    assert kept < 0.1 * total, (kept, total)
    assert len(saved["optimizer_states"][0]["state"]) == len([p for p in net.parameters() if p.requires_grad])
    record = json.loads((run / "provenance.json").read_text())["segments"][0]["initialized_from"]["pretrained"]
    assert record["weights_sha256"] == hashlib.sha256((tiny_bert / "model.safetensors").read_bytes()).hexdigest()
    # Ctrl-C as the middle step of epoch 1 starts: last.ckpt at the next step boundary, then the resume.
    with pytest.raises(Interrupted):
        fit(tmp_path / "b", *_given(lines_csv, tiny_bert), *lora, "--trainer.max_epochs=2",
            "--trainer.callbacks+=probes.CrashAt", "--trainer.callbacks.step=6", "--trainer.callbacks.signal=2",
            configs=(DIGITS, HF))  # fmt: skip
    interrupted = next((tmp_path / "b").glob("*/version_0"))
    resumed = fit(tmp_path / "b", "--ckpt_path", str(interrupted / "checkpoints" / "last.ckpt"),
                  configs=(str(interrupted / "config.yaml"),))  # fmt: skip
    assert resumed.trainer.global_step == straight.trainer.global_step
    expected = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    got = torch.load(interrupted / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        assert torch.equal(got[name], value), f"{name} differs after resuming"


@pytest.mark.guarantee(
    "under LoRA the frozen base may load in bfloat16 (half its memory) while the adapters train in float32, the "
    "loss in float32; bfloat16 without LoRA (full fine-tuning in bfloat16 weights and optimizer state) is refused",
)
@pytest.mark.slow
def test_a_bfloat16_base_under_lora_trains_float32_adapters(lines_csv: Path, tiny_bert: Path, tmp_path: Path) -> None:
    from project.hf import HFClassifier

    with pytest.raises(ConfigError, match=r"dtype=bfloat16 is for a frozen base under LoRA"):
        HFClassifier((8,), 2, str(tiny_bert), dtype="bfloat16")
    lora = ("--model.net.init_args.lora={r: 4, alpha: 8}", "--model.net.init_args.dtype=bfloat16",
            "--trainer.max_steps=3", "--trainer.max_epochs=null", "--trainer.limit_val_batches=1",
            "--trainer.log_every_n_steps=1")  # fmt: skip
    cli = fit(tmp_path, *_given(lines_csv, tiny_bert), *lora, configs=(DIGITS, HF))
    dtypes = {p.requires_grad: p.dtype for p in cli.model.net.parameters()}
    assert dtypes == {False: torch.bfloat16, True: torch.float32}  # the frozen base, what trains
    losses = [v for _, v in scalars(cli.trainer.log_dir)["train/loss"]]
    assert len(losses) == 3 and all(math.isfinite(v) for v in losses)
    x, _, _ = _batch(lines_csv, tiny_bert, n=4)
    assert cli.model.eval()(x).dtype == torch.float32


TAGS = ["comment", "paren", "quote"]


def _tagged(lines_csv: Path, path: Path) -> Path:
    """The lines with three 0/1 tags each (is a comment, holds a parenthesis, holds a quote): rows hold several."""
    with open(lines_csv, encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["text", *TAGS])
        for row in rows:
            text = row["text"]
            writer.writerow([text, int(row["label"] == "comment"), int("(" in text), int("'" in text or '"' in text)])
    return path


@pytest.mark.guarantee(
    "multi-label text classification with a Hugging Face encoder (`data.label` a list of 0/1 tag columns, the "
    "MultiLabel task): it learns (its held-out loss well below the tags' prevalence alone), the loss on a batch is "
    "transformers' own multi-label loss, and the export says `multi_label_classification` with the tags as labels",
)
@pytest.mark.slow
def test_multi_label_fine_tuning_learns_and_exports_as_transformers_multi_label(
    lines_csv: Path, tiny_bert: Path, tmp_path: Path
) -> None:
    from shipped_examples import present
    from transformers import AutoModelForSequenceClassification

    from project.data import LabelledTextDataModule

    if not present("multilabel"):  # a repository that kept the Hugging Face example but not the MultiLabel task
        pytest.skip("the multilabel example (project/tasks/multilabel.py) is not in this repository")
    from project.engine import load_run
    from project.hf import save_pretrained

    tagged = _tagged(lines_csv, tmp_path / "tagged.csv")
    unsure = tmp_path / "unsure.csv"
    unsure.write_text("text,comment,paren\n# hi,1,0\nx = f(1),0,maybe\n")
    with pytest.raises(ConfigError, match=r"row 2, column 'paren' holds 'maybe'; a tag column holds 0 or 1"):
        LabelledTextDataModule(path=str(unsure), label=["comment", "paren"])
    overlay = tmp_path / "multilabel.yaml"
    # Another task's class_path starts its arguments afresh (jsonargparse): the net and the optimizer are restated.
    overlay.write_text(
        "model:\n  class_path: project.tasks.multilabel.MultiLabel\n  init_args:\n"
        f"    net: {{class_path: project.hf.HFClassifier, init_args: {{name_or_path: {tiny_bert}}}}}\n"
        "    optimizer: {class_path: torch.optim.AdamW, init_args: {lr: 0.005, weight_decay: 0.01}}\n"
        f"data:\n  init_args:\n    label: [{', '.join(TAGS)}]\n"
    )
    given = (f"--data.path={tagged}", f"--data.tokenizer={tiny_bert}")
    fit(tmp_path, *given, *SHORT, "--trainer.max_epochs=30", configs=(DIGITS, HF, str(overlay)))
    run = tmp_path / "hf" / "version_0"
    # A predictor that knows only each tag's share p of positive rows scores the tags' mean binary entropy,
    # -(p ln p + (1 - p) ln(1 - p)), in binary cross-entropy; learning from the texts goes well below it. (Not the
    # macro F1: a step function of the threshold that can sit still for epochs while the loss falls.)
    with open(tagged, encoding="utf-8") as f:
        shares = [sum(int(r[t]) for r in rows) / len(rows) for rows in [list(csv.DictReader(f))] for t in TAGS]
    prevalence_only = sum(-(p * math.log(p) + (1 - p) * math.log(1 - p)) for p in shares) / len(shares)
    losses = [value for _, value in scalars(run)["val/loss"]]
    assert min(losses) < 0.75 * prevalence_only, (losses, prevalence_only)

    model, data = load_run(run / "checkpoints" / "best.ckpt", read_data=True)
    data.setup("fit")
    x, y = next(iter(data.val_dataloader()))
    assert y.dtype == torch.float32 and y.shape == (len(x), len(TAGS)) and set(y.unique().tolist()) == {0.0, 1.0}
    exported = AutoModelForSequenceClassification.from_pretrained(save_pretrained(run) / "model").eval()
    assert exported.config.problem_type == "multi_label_classification"
    assert exported.config.id2label == dict(enumerate(TAGS))
    with torch.no_grad():
        ours = model.eval().loss(model(x), y).mean()
        theirs = exported(input_ids=x, attention_mask=(x != data.pad_id).long(), labels=y).loss
    # The same weights and ops (BCE with logits, a mean over the batch's tags): equal up to float32 rounding.
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)
