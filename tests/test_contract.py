"""The contract suite: the template's key guarantees, run against the task, data and net that
``configs/default.yaml`` selects ("default": after you swap in your own task, DataModule or net, these say whether
it keeps them), and against a generated fixture for each shipped task: classification of an image folder
("images"), regression on a CSV table ("regression"), the manual's one-file custom task, multi-label
classification ("multilabel"), semantic segmentation of images with masks ("segmentation"), and a language
model on a text corpus ("language_model": token ids in, a class per position, generation as its prediction), and
text classification ("text_classification": texts of different lengths, padded per batch); and the engine's own
projects of other shapes (tests/shapes.py): two named inputs ("two_inputs"), no targets with in-batch negatives
("contrastive"), a GAN with two optimizers ("gan"). ``make contract CONFIG=configs/yours.yaml`` runs it on another
config of yours (the "default" subject, alone). Nothing here knows which task it runs: each test reads what the task
and the DataModule declare, and skips a guarantee the task declares it cannot hold (``Task.cannot_promise``).

Every run here is short (limits given as flags), so the suite stays cheap on any data; the longer, closed-form
versions of each guarantee run on digits in the other test files.
"""

import csv
import functools
import json
import os
import shutil
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import (
    DIGITS,
    HF_TEXT_CLASSES,
    HOST_SYNCS,
    IMAGES,
    LANGUAGE_MODEL,
    MULTILABEL,
    REGRESSION,
    ROOT,
    SEGMENTATION,
    SFT,
    TEXT_CLASSES,
    USER_DEFAULT,
    default_data_missing,
    fit,
    offending_ops,
    run_ranks,
    scalars,
)  # fmt: skip
from probes import Recorder
from shipped_examples import present

from project.engine import CLI, IGNORE_INDEX, DataModule, Task, load_run, main, planned_steps
from project.engine.checkpointing.last_checkpoint import Interrupted
from project.engine.checkpointing.portable import EXAMPLES
from project.engine.data import batches
from project.engine.data.normalization import NORMALIZATION_SAMPLES

pytestmark = [
    pytest.mark.slow,
    pytest.mark.guarantee("the manual's custom task is the shipped file, and trained by the contract suite"),
    pytest.mark.guarantee(
        "every checkpoint loads with `weights_only=True`; hparams are plain data; the net is rebuilt from them"
    ),
    pytest.mark.guarantee(
        "**the contract suite**, on what `configs/default.yaml` selects and on a generated fixture per shipped "
        "task (image classification, regression, the multi-label custom task, segmentation, the language model): "
        "the task and the DataModule declare their contracts (targets, names, judged metric) and the normalisation "
        "is the training split's; fit learns one batch by heart; a run interrupted mid-epoch resumes bit for bit; "
        "accumulation = big batch and 2 DDP processes = 1 (float64, per-step gradients / final weights); predict "
        "writes the task's columns for the very outputs the test scores come from; the export matches the "
        "checkpoint from raw inputs; the inspect notebook runs on a classifier, a regressor and a segmenter"
    ),
    pytest.mark.guarantee(
        'the language model (the contract suite\'s "language_model" subject): int64 token ids of a declared '
        "vocabulary, never normalised; learns one batch by heart; resumes bit for bit; accumulation = big batch; "
        "greedy generation = the argmax of the teacher-forced forward, with the sampling settings given at predict "
        "time; the export takes int64 prompts of any length up to the block (parity at 1, 7 and the block) and "
        "says so in `model.json`"
    ),
]
# The user's default, the engine's own shapes, then each shipped example this repository still has (deleting one
# removes its subject). `make contract CONFIG=...` names another config of the user's: that one alone.
GIVEN = os.environ.get("PROJECT_CONTRACT_CONFIG")
CONFIG = str((ROOT / GIVEN).resolve()) if GIVEN else USER_DEFAULT
EXAMPLE_SUBJECTS = ("images", "regression", "multilabel", "segmentation", "language_model", "text_classification",
                    "hf", "sft")  # fmt: skip
SHAPES = ("two_inputs", "contrastive", "gan")
SUBJECTS = ("default",) if CONFIG != USER_DEFAULT else (
    "default", *SHAPES, *(example for example in EXAMPLE_SUBJECTS if present(example))
)  # fmt: skip


def _param(subject: str, engine: bool = False) -> Any:
    """A subject as a parameter: the engine's own shapes (and what ``engine`` says) run in make test-all only, since
    no edit to a user room reaches them; the user's config and each shipped example run in make test."""
    return pytest.param(subject, marks=pytest.mark.engine) if engine or subject in SHAPES else subject


def _among(*subjects: str, make_test: tuple[str, ...] | None = None) -> list[Any]:
    """Those of ``subjects`` this repository has (a test chosen for some subjects), those not in ``make_test`` (when
    given) in make test-all only; none: one skipped, saying why."""
    chosen = [_param(s, make_test is not None and s not in make_test) for s in subjects if s in SUBJECTS]
    why = f"runs on {', '.join(subjects)} only" + (" (make contract's config is none of them)" if GIVEN else "")
    return chosen or [pytest.param("default", marks=pytest.mark.skip(reason=why))]


EVAL = ("--trainer.limit_val_batches=4", "--trainer.num_sanity_val_steps=0")
# The subject's short run (2 epochs of at most 6 batches, every step logged): `trained`, which the resume test also
# takes as the uninterrupted run.
SHORT = ("--trainer.max_epochs=2", "--trainer.limit_train_batches=6", "--trainer.log_every_n_steps=1", *EVAL)


@pytest.fixture(scope="module", params=[_param(subject) for subject in SUBJECTS])
def subject(
    request: pytest.FixtureRequest,
    image_folder: Path,
    regression_csv: Path,
    tags_csv: Path,
    segmentation_folder: Path,
    text_corpus: Path,
    lines_csv: Path,
) -> tuple[str, ...]:
    """The config arguments of one subject: ``--config`` files and the flags that point them at their data."""
    if request.param == "default" and (why := default_data_missing(config=CONFIG)):
        pytest.skip(why)
    if request.param == "hf":  # the tiny BERT is built (and the hf extra needed) for this subject only
        bert = request.getfixturevalue("tiny_bert")
        return ("--config", DIGITS, "--config", HF_TEXT_CLASSES, f"--data.path={lines_csv}",
                f"--data.tokenizer={bert}", f"--model.net.init_args.name_or_path={bert}")  # fmt: skip
    if request.param == "sft":  # the tiny Llama is built (and the hf extra needed) for this subject only
        chat, chats = request.getfixturevalue("tiny_chat"), request.getfixturevalue("chats_jsonl")
        return ("--config", DIGITS, "--config", SFT, f"--data.path={chats}", f"--data.tokenizer={chat}",
                f"--model.net.init_args.name_or_path={chat}")  # fmt: skip
    return {
        "default": ("--config", CONFIG),
        **{
            shape: ("--config", DIGITS, "--config", str(ROOT / "tests" / "configs" / f"{shape}.yaml"))
            for shape in SHAPES
        },
        "images": ("--config", DIGITS, "--config", IMAGES, f"--data.root={image_folder}"),
        "regression": ("--config", DIGITS, "--config", REGRESSION, f"--data.path={regression_csv}"),
        "multilabel": ("--config", DIGITS, "--config", MULTILABEL, f"--data.path={tags_csv}"),
        "segmentation": ("--config", DIGITS, "--config", SEGMENTATION, f"--data.root={segmentation_folder}"),
        "language_model": ("--config", DIGITS, "--config", LANGUAGE_MODEL, f"--data.path={text_corpus}"),
        "text_classification": ("--config", DIGITS, "--config", TEXT_CLASSES, f"--data.path={lines_csv}"),
    }[request.param]


@pytest.fixture(autouse=True)
def _relative_paths_mean_what_they_mean_for_make(subject: tuple[str, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    """configs/default.yaml's relative paths (data.root, data.path) are relative to the repository, where `make`
    runs. Every run here still writes only under a temporary directory (each save_dir is given)."""
    if CONFIG in subject:
        monkeypatch.chdir(ROOT)


def _fit(save_dir: Path, subject: tuple[str, ...], *args: str) -> CLI:
    return CLI(["fit", *subject, *_warmup_of_a_short_run(subject), f"--trainer.logger.init_args.save_dir={save_dir}",
                *args])  # fmt: skip


@functools.cache
def _warmup_of_a_short_run(subject: tuple[str, ...]) -> tuple[str, ...]:
    """The suite's runs are a few steps long: an owner's warmup given as a count of steps (``model.warmup: 49``) goes
    into them as the fraction of the owner's own run that it is, rather than as a count longer than them, which the
    recipe refuses. A fraction is kept as it is."""
    cli = _configured(subject)
    warmup = cli.model.hparams.get("warmup")
    if not isinstance(warmup, int) or isinstance(warmup, bool) or warmup == 0:
        return ()
    trainer, datamodule = cli.trainer, cli.datamodule
    datamodule.setup("fit")
    batches, limit = len(datamodule.train_dataloader()), trainer.limit_train_batches
    batches = limit if isinstance(limit, int) else int(batches * limit)  # Lightning's rule for limit_train_batches
    total = planned_steps(batches, trainer.accumulate_grad_batches, trainer.max_epochs, trainer.max_steps)
    return (f"--model.warmup={warmup / total}",)  # < 1: the owner's run has more steps than its warmup


def _has_batchnorm(cli: CLI) -> bool:
    return any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in cli.model.modules())


@pytest.fixture(scope="module")
def trained(subject: tuple[str, ...], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, CLI]:
    """A short run of the subject (SHORT), tested on the whole test split."""
    save_dir, before = tmp_path_factory.mktemp("trained"), Path.cwd()
    os.chdir(ROOT if CONFIG in subject else save_dir)  # as _relative_paths_mean_what_they_mean_for_make
    try:
        cli = _fit(save_dir, subject, *SHORT)
    finally:
        os.chdir(before)
    return Path(cli.trainer.log_dir), cli


def _batch(dm: DataModule, inputs: Any, targets: Any) -> Any:
    """A batch as the DataModule's loaders yield it: (inputs, targets), or the inputs alone without targets."""
    return inputs if dm.target_kind is None else (inputs, targets)


def _one(inputs: Any, i: int = 0) -> Any:
    """Sample ``i`` of a batch of inputs (one tensor or several named ones)."""
    return batches.each(inputs, lambda t: t[i])


def _equal(a: Any, b: Any) -> bool:
    """Two batches (tensors, dicts of them, or None) hold the same values."""
    if isinstance(a, dict) or isinstance(b, dict):
        return (
            isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
        )
    return a is b is None or (a is not None and b is not None and torch.equal(a, b))


def test_the_task_and_the_datamodule_declare_their_contracts(subject: tuple[str, ...], tmp_path: Path) -> None:
    cli = _configured(subject)
    task, dm = cli.model, cli.datamodule
    assert isinstance(task, Task) and isinstance(dm, DataModule)
    # The task says how it is judged, by a metric it logs, and learns from the targets the data serves (or none).
    assert task.monitor.startswith("val/") and task.mode in ("min", "max")
    assert task.monitor == "val/loss" or task.monitor in task.val_metrics.keys()  # noqa: SIM118 (prefixed)
    assert task.target_kind == dm.target_kind and dm.target_kind in ("classes", "values", None)
    names = dm.target_names
    assert len(set(names)) == len(names) and all(isinstance(n, str) for n in names)
    assert task.target_names == names and (len(names) >= 1) == (dm.target_kind is not None)
    dm.setup("fit")
    sample = dm.train_set[0]
    x, y = (sample, None) if dm.target_kind is None else sample
    named = dm.named_inputs
    if named:  # several inputs, each as declared: a dict of the declared names, shapes and dtypes
        assert isinstance(x, dict) and list(x) == list(named)
        for name, (shape, dtype) in named.items():
            assert x[name].shape == shape and x[name].dtype == dtype, name
    else:
        assert x.dtype == dm.input_dtype in (torch.float32, torch.int64)
    if not named and dm.collate_fn is None:
        assert x.shape == dm.input_shape
    elif not named:  # samples of different lengths, at most the declared one, padded per batch
        assert x.ndim == len(dm.input_shape) == 1 and 1 <= len(x) <= dm.input_shape[0]
    tokens = not named and not dm.input_dtype.is_floating_point
    if tokens:  # token ids of the declared vocabulary, never normalised
        assert dm.vocabulary and ((x >= 0) & (x < len(dm.vocabulary))).all() and dm.normalization is None
    inputs, targets = dm.split_tensors("val")
    if dm.target_kind is None:  # no targets: nothing for the net's outputs to be compared with
        assert targets is None
        outputs = None
    elif dm.target_kind == "classes":  # int64 class indices, at least two classes: per sample, pixel or position
        shapes = ((),) if named else ((), x.shape[1:], x.shape)  # per sample, pixel or position
        assert len(names) >= 2 and y.dtype == torch.int64 and y.shape in shapes
        counted = targets != IGNORE_INDEX
        assert targets.dtype == torch.int64 and ((targets >= 0) & (targets < len(names)) | ~counted).all()
        if dm.collate_fn is not None and y.shape == x.shape:  # a target per position, padded as the inputs are
            y = torch.empty(inputs.shape[1:], dtype=y.dtype)
        assert targets.shape == (batches.size(inputs), *y.shape)
        # One logit per class, for the sample or for each of its pixels or positions, where the task keeps them.
        outputs = (3, len(names), *y.shape) if task.class_dim == 1 else (3, *y.shape, len(names))
    else:  # one float32 value per name, never cast to an integer
        assert y.dtype == torch.float32 and y.shape == (len(names),)
        assert targets.dtype == torch.float32 and targets.shape == (batches.size(inputs), len(names))
        outputs = (3, len(names))
    # The net has one output per target name (per pixel, for a class map); a row per sample without targets.
    with torch.no_grad():
        got = task.eval()(dm.normalize(batches.first(inputs, 3)))
    assert got.shape == outputs if outputs else len(got) == 3
    # The normalisation, if any, is the training split's own: normalised training inputs have mean 0 and std 1
    # per channel (feature) of each float input, to float64 rounding of the sums (relative 1e-6 leaves room for
    # float32 inputs).
    stats = dm.normalization
    if stats is not None:
        train, _ = dm.split_tensors("train")
        per_input = {n: (stats.get(n), train[n]) for n in named} if named else {None: (stats, train)}
        for name, (numbers, raw) in per_input.items():
            if numbers is None:  # token ids or another input without statistics: unchanged
                assert not named[name][1].is_floating_point  # type: ignore[index]
                continue
            assert len(numbers["mean"]) == len(numbers["std"]) == raw.shape[1], name
            if len(raw) <= NORMALIZATION_SAMPLES:  # otherwise computed on a seeded subset of that size
                normalized = dm.normalize({name: raw.double()} if named else raw.double())
                z = (normalized[name] if named else normalized).transpose(0, 1).flatten(1)
                live = torch.tensor(numbers["std"]) > 1e-6  # a constant channel stays unscaled
                torch.testing.assert_close(z.mean(1), torch.zeros(len(z), dtype=torch.float64), rtol=0, atol=1e-6)
                ones = torch.ones(int(live.sum()), dtype=torch.float64)
                torch.testing.assert_close(z.std(1, correction=0)[live], ones)
    if tokens:  # a text file comes back from the predict decoder as each line's ids, in order (bytes, here)
        texts = ["def f(x):", "The quick brown fox", "x = 1"]
        (tmp_path / "texts.txt").write_text("\n".join(texts))
        decoded = dm.load_predict_inputs(tmp_path / "texts.txt")
        assert len(decoded) == len(texts)
        for i, text in enumerate(texts):
            ids = decoded[i][0].tolist()
            assert all(0 <= t < len(dm.vocabulary) for t in ids)
            if hasattr(dm, "prompt_ids"):  # a chat model's: each line a user turn, in the model's chat template
                chat = [{"role": "user", "content": text}]
                rendered = dm.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
                assert text in rendered and ids == dm.tokenizer(rendered, add_special_tokens=False)["input_ids"]
            elif hasattr(dm, "tokenizer_object") and dm.vocabulary[0] != "<0x00>":  # a pretrained model's tokenizer
                tokenizer = dm.tokenizer_object()
                assert ids == tokenizer(text, truncation=True, max_length=dm.input_shape[0])["input_ids"]
            else:
                assert bytes(t for t in ids if dm.vocabulary[t].startswith("<0x")).decode() == text
    elif named:  # raw inputs saved as .npz, an array per name, come back from the predict decoder unchanged
        np.savez(tmp_path / "inputs.npz", **{n: t[:5].numpy() for n, t in inputs.items()})
        assert _equal(dm.load_predict_inputs(tmp_path / "inputs.npz"), batches.first(inputs, 5))
    else:  # a raw input saved as .npy comes back from the predict decoder unchanged
        path = tmp_path / "inputs.npy"
        np.save(path, inputs[:5].numpy())
        assert torch.equal(dm.load_predict_inputs(path), inputs[:5])
    # show() draws something for a person to look at.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    dm.show(_one(inputs), ax)
    assert ax.images or ax.patches or ax.texts
    plt.close(fig)


# Ops torch documents as having no deterministic CUDA kernel: under trainer.deterministic (configs/default.yaml
# sets it) they raise at the first step on a GPU, while a CPU runs them silently (torch.use_deterministic_algorithms
# lists them). Each is named as the op itself or the backward that has no such kernel.
NONDETERMINISTIC_ON_CUDA = {
    "avg_pool3d_backward", "_adaptive_avg_pool2d_backward", "_adaptive_avg_pool3d_backward",
    "adaptive_max_pool2d_backward", "fractional_max_pool2d_backward", "fractional_max_pool3d_backward",
    "max_unpool2d", "max_unpool3d", "upsample_linear1d_backward", "upsample_bilinear2d_backward",
    "upsample_bicubic2d_backward", "upsample_trilinear3d_backward", "_upsample_bilinear2d_aa_backward",
    "_upsample_bicubic2d_aa_backward", "reflection_pad1d_backward", "reflection_pad2d_backward",
    "reflection_pad3d_backward", "_ctc_loss_backward", "put_", "histc", "median", "grid_sampler_2d_backward",
    "grid_sampler_3d_backward",
}  # fmt: skip


def _nondeterministic_on_cuda(func: Any, args: tuple, kwargs: dict) -> bool:
    name = func.overloadpacket.__name__
    if name in ("nll_loss2d_forward", "nll_loss2d_backward"):  # deterministic only unreduced (reduction 0)
        return args[3 if name == "nll_loss2d_forward" else 4] != 0
    if name == "cumsum":
        return args[0].is_floating_point()
    if name == "bincount":
        return (args[1] if len(args) > 1 else kwargs.get("weights")) is not None
    return name in NONDETERMINISTIC_ON_CUDA or (name == "_embedding_bag" and len(args) > 4 and args[4] == 2)


@pytest.mark.guarantee(
    "a training step of each contract subject (and of `configs/default.yaml`) dispatches no op without a "
    "deterministic CUDA kernel, so `trainer.deterministic: true` cannot crash a GPU run at its first step (seen "
    "failing with bilinear upsampling in the UNet and with a mean-reduced per-pixel loss)",
)
def test_a_training_step_uses_only_ops_with_a_deterministic_cuda_kernel(subject: tuple[str, ...]) -> None:
    """The net's forward, the task's loss and their backward, op by op as torch dispatches them (the same ops on
    a CPU and a GPU): none may lack a deterministic CUDA kernel, which would make a GPU run crash at its first step
    (e.g. bilinear upsampling in a decoder, or a mean-reduced per-pixel cross-entropy)."""
    cli = _configured(subject)
    task, dm = cli.model.train(), cli.datamodule
    dm.setup("fit")
    inputs, targets = (batches.first(t, 8) for t in dm.split_tensors("train"))
    offending = offending_ops(
        _nondeterministic_on_cuda, lambda: task.loss(task(dm.normalize(inputs)), targets).mean().backward()
    )
    assert offending == set(), f"ops with no deterministic CUDA kernel: {sorted(offending)}"
    assert any(p.grad is not None for p in task.parameters())  # the backward ran under the mode


def _host_sync_on_a_gpu(func: Any, args: tuple, kwargs: dict) -> bool:
    if func.overloadpacket.__name__ not in HOST_SYNCS:
        return False
    # torchmetrics' logits check (normalize_logits_if_needed) reads the tensor on a CPU only, where a read is free;
    # on a GPU it keeps the check on the device.
    frame = sys._getframe()
    while frame is not None and frame.f_code.co_name != "normalize_logits_if_needed":
        frame = frame.f_back
    return frame is None


def test_an_evaluation_step_makes_the_host_wait_for_nothing(subject: tuple[str, ...]) -> None:
    """A validation step (the net, the loss per sample, every metric's update), op by op: none reads a value back
    to the host. On a GPU each such read waits for every queued kernel, at every batch (torchmetrics' argument
    checks did, with torch.unique on the targets: the multi-label task turns them off)."""
    if HF_TEXT_CLASSES in subject or SFT in subject:
        pytest.skip(
            "transformers builds its attention mask after reading the padding (or the position ids, for packed "
            "sequences) on the host (masking_utils): one sync per forward, in its code"
        )
    cli = _configured(subject)
    task, dm = cli.model.eval(), cli.datamodule
    dm.setup("fit")
    inputs, targets = (batches.first(t, 8) for t in dm.split_tensors("val"))
    with torch.no_grad():
        offending = offending_ops(
            _host_sync_on_a_gpu,
            lambda: task.validation_step(_batch(dm, dm.normalize(inputs), targets), 0),
        )
    assert offending == set(), f"ops that make the host wait for the device: {sorted(offending)}"
    assert task.val_loss.update_count == 1  # the step ran under the mode, metrics and all


def test_fit_learns_one_batch_by_heart(subject: tuple[str, ...], tmp_path: Path) -> None:
    """A net and loss that work drive the loss on one repeated batch down: the cheapest proof that data, net and
    loss are wired together, whatever the data. The bar, per task: a sample task's loss halves in 30 steps. A token
    task's must fall, within 60, below the entropy of the batch's target frequencies: the lowest loss a predictor
    that ignores its inputs can reach on that batch (a language model's unigram loss), so only a net that reads its
    context passes (a halving of ln(vocabulary) is no such line: it is about the unigram loss of text)."""
    task = _configured(subject).model
    _unless_waived(task, "learns_one_batch_by_heart")
    tokens = task.counted == "tokens"
    steps = 60 if tokens else 30
    cli = _fit(tmp_path, subject, "--trainer.overfit_batches=1", f"--trainer.max_epochs={steps}",
               "--trainer.log_every_n_steps=1", "--trainer.limit_val_batches=0",
               "--trainer.enable_checkpointing=false", "--trainer.callbacks+=probes.Recorder")  # fmt: skip
    losses = [v for _, v in scalars(cli.trainer.log_dir)["train/loss"]]
    assert len(losses) == steps
    if not tokens:
        assert min(losses[-5:]) < 0.5 * losses[0], losses
        return
    recorder = next(cb for cb in cli.trainer.callbacks if isinstance(cb, Recorder))
    dataset = recorder.dataset.inner  # type: ignore[union-attr]
    targets = torch.cat([dataset[i][1].flatten() for i in recorder.batches()[0]])
    counts = torch.bincount(targets[targets != IGNORE_INDEX]).double()
    frequencies = counts[counts > 0] / counts.sum()
    unigram = float(-(frequencies * frequencies.log()).sum())
    assert all(b == recorder.batches()[0] for b in recorder.batches())  # the one batch, repeated
    assert max(losses[-5:]) < unigram < losses[0], (unigram, losses)


def test_a_run_interrupted_mid_epoch_resumes_bit_for_bit(trained: tuple[Path, CLI], subject: tuple[str, ...],
                                                         tmp_path: Path) -> None:  # fmt: skip
    _, straight = trained  # the uninterrupted run
    per_epoch = int(straight.trainer.num_training_batches)  # 6, or fewer on a small split
    assert per_epoch >= 2 and straight.trainer.global_step == 2 * per_epoch
    # Ctrl-C as the middle step of epoch 1 starts: last.ckpt at the next step boundary, then `make resume`.
    with pytest.raises(Interrupted):
        _fit(tmp_path / "resumed", subject, *SHORT, "--trainer.callbacks+=probes.CrashAt",
             f"--trainer.callbacks.step={per_epoch + per_epoch // 2}", "--trainer.callbacks.signal=2")  # fmt: skip
    run = next((tmp_path / "resumed").glob("*/version_0"))
    resumed = fit(tmp_path / "resumed", "--ckpt_path", str(run / "checkpoints" / "last.ckpt"),
                  configs=(str(run / "config.yaml"),))  # fmt: skip
    assert resumed.trainer.global_step == straight.trainer.global_step
    expected = torch.load(Path(straight.trainer.log_dir) / "checkpoints" / "last.ckpt", weights_only=True)
    got = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    for name, value in expected["state_dict"].items():
        assert torch.equal(got["state_dict"][name], value), f"{name} differs after resuming"
    # Every step once, with the uninterrupted run's value; in step order: TensorBoard reads a directory's event files
    # in name order (the second each was opened, then a counter of the process's writers), and these two segments,
    # fitted in one process, can open in one second as the counter goes from 9 to 10: the resumed file comes first.
    curve = scalars(run)["train/loss"]
    assert sorted(curve) == scalars(straight.trainer.log_dir)["train/loss"] and len(dict(curve)) == len(curve)


def _unless_waived(task: Task, promise: str) -> None:
    """Skips a guarantee the task declares it cannot hold (``Task.cannot_promise``), with its reason."""
    if promise in task.cannot_promise:
        pytest.skip(f"{type(task).__name__} cannot promise {promise}: {task.cannot_promise[promise]}")


@functools.cache
def _configured(subject: tuple[str, ...]) -> CLI:
    """The subject's task and DataModule as configured, built once per test process: for what a test reads of them
    (what the task declares, its net's kind) or runs a step of by hand; a run trains a task of its own."""
    return CLI(list(subject), run=False)


def _recorded(save_dir: Path, subject: tuple[str, ...], *args: str) -> Recorder:
    task = _configured(subject).model
    if not task.automatic_optimization:
        pytest.skip(f"{type(task).__name__} steps its optimizers itself (manual optimization), which Lightning "
                    "cannot accumulate for: a run refuses trainer.accumulate_grad_batches > 1")  # fmt: skip
    _unless_waived(task, "accumulation_equals_the_big_batch")
    cli = _fit(save_dir, subject, "--trainer.precision=64-true", "--trainer.max_steps=3", "--trainer.max_epochs=1",
               "--trainer.limit_val_batches=0", "--trainer.callbacks+=probes.NoDropout",
               "--trainer.callbacks+=probes.Recorder", "--trainer.callbacks.keep_grads=true", *args)  # fmt: skip
    if _has_batchnorm(cli):
        pytest.skip("the net has BatchNorm: micro-batches are normalised over themselves, so accumulation is not "
                    "a big batch by design (docs/scaling.md, Several devices)")  # fmt: skip
    return next(cb for cb in cli.trainer.callbacks if isinstance(cb, Recorder))


def test_accumulation_equals_the_big_batch(subject: tuple[str, ...], tmp_path: Path) -> None:
    small = _recorded(tmp_path / "small", subject, "--data.batch_size=4", "--trainer.accumulate_grad_batches=2")
    large = _recorded(tmp_path / "large", subject, "--data.batch_size=8")
    assert [i for b in small.batches() for i in b] == [i for b in large.batches() for i in b]
    # In float64 the only difference is the summation order (2 means of 4 vs one mean of 8): ~1e-16 relative
    # per operation; 1e-9 leaves 10^6 for the depth of the net; a missing or doubled micro-batch is O(1).
    # A net that computes some of its forward in float32 whatever the precision (transformers' RMSNorm, RoPE and
    # softmax: `float32_inside`) rounds at float32's 6e-8 there: the gradients then agree to about 1e-6 of their
    # largest element (1e-5 allows for depth), while a missing or doubled micro-batch moves them by about half of it.
    float32_inside = getattr(_configured(subject).model.net, "float32_inside", False)
    for step, (a, b) in enumerate(zip(small.grads, large.grads, strict=True)):
        rtol, atol = (0.0, 1e-5 * b.abs().max().item()) if float32_inside else (1e-9, 1e-11)
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=lambda m, s=step: f"gradient of step {s}: {m}")


# Not on the multi-label fixture: its task differs from the regressor's only in its loss and metrics (same data
# path, same float targets), and a DDP launch costs ~20 s; nor on the image folder's: its samples reach the
# engine's sharded sampler as any Dataset's do (decoded in the process here: num_workers=0), into the ConvNet that
# test_ddp.py checks on 2 processes. On the segmentation fixture: the UNet's GroupNorm is what makes 2 x B equal
# 1 x 2B there. On two named inputs: a dict of tensors per sample, collated and normalised per name.
@pytest.mark.parametrize("subject", _among("default", "regression", "segmentation", "two_inputs"), indirect=True)
def test_two_processes_equal_one_on_the_combined_batch(subject: tuple[str, ...], tmp_path: Path) -> None:
    task = _configured(subject).model
    _unless_waived(task, "two_processes_equal_one")
    # Several optimizers: each step leaves the other parts' parameters unused, which plain DDP refuses.
    unused = ["--trainer.strategy=ddp_find_unused_parameters_true"] if len(task.optimizers_of_parts or {}) > 1 else []
    common = ("--trainer.precision=64-true", "--trainer.max_steps=3", "--trainer.max_epochs=1",
              "--trainer.limit_val_batches=0", "--trainer.accelerator=cpu", "--data.num_workers=0",
              "--trainer.callbacks+=probes.NoDropout", "--trainer.callbacks+=probes.Recorder")  # fmt: skip
    single = _fit(tmp_path / "single", subject, *common, f"--trainer.callbacks.out_dir={tmp_path / 'one'}",
                  "--data.batch_size=8")  # fmt: skip
    if _has_batchnorm(single):
        pytest.skip("the net has BatchNorm: 2 x B equals 1 x 2B only with trainer.sync_batchnorm, which needs GPUs")
    ddp = run_ranks("fit", *subject, "--config", str(ROOT / "configs" / "ddp.yaml"), *_warmup_of_a_short_run(subject),
                    *common, *unused,
                    f"--trainer.logger.init_args.save_dir={tmp_path / 'ddp'}", "--data.batch_size=4",
                    f"--trainer.callbacks.out_dir={tmp_path / 'two'}", cwd=Path.cwd())  # fmt: skip
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    one = torch.load(tmp_path / "one" / "rank0.pt", weights_only=True)
    ranks = [torch.load(tmp_path / "two" / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    for step, batch in enumerate(one["batches"]):
        assert sorted(batch) == sorted(ranks[0]["batches"][step] + ranks[1]["batches"][step])
    # float64 (see test_ddp.py): summation order alone differs; 1e-10 on weights after 3 AdamW steps.
    for name, value in one["final_state"].items():
        torch.testing.assert_close(ranks[0]["final_state"][name], value, rtol=0, atol=1e-10, msg=name)


def _outputs_by_hand(cli: CLI, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The trained task's outputs on a whole split at once, in eval mode, as Lightning feeds it; and the targets."""
    inputs, targets = cli.datamodule.split_tensors(split)
    with torch.inference_mode():
        return cli.model.eval()(cli.datamodule.normalize(inputs)), targets


def _assert_same_cells(got: list[str], want: list[object]) -> None:
    """A prediction row against the one computed here: names exactly, numbers to float32 rounding (the loader's
    batches and the whole split at once sum in different orders: ~1e-7 relative; 6 printed digits)."""
    assert len(got) == len(want)
    for cell, value in zip(got, want, strict=True):
        try:
            number = float(cell)
        except ValueError:
            assert cell == str(value)
            continue
        assert number == pytest.approx(float(str(value)), rel=2e-5, abs=1e-6), (got, want)


def _test_loss_by_hand(task: Task, outputs: torch.Tensor, targets: torch.Tensor | None, batch_size: int) -> float:
    """The test loss from the outputs on the whole split, batch by batch as the loader serves it (a loss with
    in-batch negatives depends on the batch; any other is the same on the whole split at once)."""
    chunks = range(0, len(outputs), batch_size)
    losses = torch.cat([task.loss(outputs[i : i + batch_size], batches.first(targets[i:], batch_size)
                                  if targets is not None else None) for i in chunks])  # fmt: skip
    if task.counted == "tokens":
        counted = targets != IGNORE_INDEX
        return float(losses.masked_fill(~counted, 0.0).sum() / counted.sum())
    return float(losses.mean())


def test_predict_writes_the_tasks_columns_and_test_scores_the_same_outputs(trained: tuple[Path, CLI]) -> None:
    run, cli = trained
    task, dm = cli.model, cli.datamodule
    if hasattr(task, "generate"):
        pytest.skip("a prediction of this task is a generation: test_greedy_generation_is_the_teacher_forced_argmax")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        main(["predict", "--config", str(run / "config.yaml"), f"--ckpt_path={run / 'checkpoints' / 'best.ckpt'}"])
    # Predict writes no checkpoint: it restores no checkpoint callback, nor warns that their directory "has changed".
    assert not [str(w.message) for w in caught if "dirpath has changed" in str(w.message)]
    with open(run / "predictions.csv") as f:
        rows = list(csv.reader(f))
    # One row per test sample, in order: the task's own columns for what the model outputs on that sample.
    outputs, targets = _outputs_by_hand(cli, "test")
    header, expected = task.prediction_table(task.prediction(outputs).float())
    carried = list(dm.test_columns)  # what the DataModule carries through from the inputs (a text, an ID column)
    assert rows[0] == ["index", *carried, *header] and "label" not in rows[0]  # `label` would name a true label
    assert len(rows) == len(expected) + 1
    for row, want in zip(rows[1:], expected, strict=True):
        _assert_same_cells(row[1 + len(carried) :], want)
    # The logged test scores are the task's metrics over exactly these outputs (the whole split, exact).
    metrics = task.configure_metrics()
    task.update_metrics(metrics, outputs, targets)
    logged = scalars(run)
    by_hand = _test_loss_by_hand(task, outputs, targets, dm.hparams["batch_size"])
    assert logged["test/loss"][0][1] == pytest.approx(by_hand, rel=1e-5)
    for name, value in metrics.compute().items():
        (_, test_value), *_ = logged[f"test/{name}"]
        assert float(value) == pytest.approx(test_value, rel=1e-5, abs=1e-6), name
    # The same inputs given as a file (raw units, as the DataModule decodes them) get the same predictions.
    given = _test_inputs_file(dm, run)
    main(["predict", "--config", str(run / "config.yaml"), f"--ckpt_path={run / 'checkpoints' / 'best.ckpt'}",
          f"--data.predict_path={given}"])  # fmt: skip
    with open(run / "predictions.csv") as f:
        got = list(csv.reader(f))[1:]
    # The index and the task's columns: the file carries none of the split's (a table's id columns), and its batches
    # pad token sequences to other lengths than the split's (the same outputs to float32 rounding).
    assert len(got) == len(rows[1:21])
    for row, want in zip(got, rows[1:21], strict=True):
        _assert_same_cells([row[0], *row[-len(header) :]], [want[0], *want[-len(header) :]])


def _test_inputs_file(dm: DataModule, folder: Path) -> Path:
    """The first 20 test inputs as a file predict reads: a .npy array in raw units, or texts, a line each."""
    inputs, _ = dm.split_tensors("test", 20)
    if dm.named_inputs:  # several named inputs: an array per name
        np.savez(folder / "test_inputs.npz", **{n: t.numpy() for n, t in inputs.items()})
        return folder / "test_inputs.npz"
    if dm.input_dtype.is_floating_point:
        np.save(folder / "test_inputs.npy", inputs.numpy())
        return folder / "test_inputs.npy"
    if "input" in dm.test_columns:  # the test split's texts as they were read (a WordPiece's decode is no inverse)
        texts = dm.test_columns["input"][:20]
    else:
        texts = [bytes(t for t in x.tolist() if dm.vocabulary[t].startswith("<0x")).decode() for x in inputs]
    # A text per line: a block's own line breaks (and Python's other line separators, as a form feed) as spaces.
    (folder / "test_inputs.txt").write_text("\n".join(" ".join(t.splitlines()) for t in texts if t.strip()))
    return folder / "test_inputs.txt"


@contextmanager
def _data_moved_away(cli: CLI, tmp_path: Path) -> Iterator[None]:
    """The fixture's data, moved away for the length of the block (a user's data in the repository is left alone),
    as on a machine the run directory was copied to."""
    data = [Path(v) for k, v in cli.datamodule.hparams.items() if k in ("path", "root") and v]
    gone = [(d, tmp_path / f"gone-{i}") for i, d in enumerate(data) if ROOT not in d.resolve().parents]
    for place, away in gone:
        place.rename(away)
    try:
        yield
    finally:
        for place, away in gone:
            away.rename(place)


@pytest.mark.guarantee(
    "a run directory copied where its training data is not predicts on files the same bytes and exports with the "
    "same parity (every shipped DataModule)"
)
def test_a_copied_run_predicts_and_exports_without_its_training_data(trained: tuple[Path, CLI], tmp_path: Path) -> None:
    """The run directory is all a model needs: copied elsewhere while its training data is gone (as on another
    machine), predict on files writes the same bytes, from what the checkpoint keeps (the export test below exports
    such a copy)."""
    run, cli = trained
    given = _test_inputs_file(cli.datamodule, tmp_path)
    given_on_the_command_line = [f"--data.predict_path={given}"]
    if hasattr(cli.model, "generate"):
        given_on_the_command_line += ["--model.temperature=0", "--model.max_new_tokens=4"]
    best = Path("checkpoints") / "best.ckpt"
    main(["predict", "--config", str(run / "config.yaml"), f"--ckpt_path={run / best}", *given_on_the_command_line])
    copy = tmp_path / "elsewhere" / run.name
    shutil.copytree(run, copy)
    with _data_moved_away(cli, tmp_path):
        main(["predict", "--config", str(copy / "config.yaml"), f"--ckpt_path={copy / best}",
              *given_on_the_command_line])  # fmt: skip
        _, rebuilt = load_run(copy / best, read_data=False)
    assert (copy / "predictions.csv").read_bytes() == (run / "predictions.csv").read_bytes()
    for kept, split in zip(rebuilt.examples(), cli.datamodule.split_tensors("test", EXAMPLES), strict=True):
        assert _equal(kept, split)  # the first test inputs and their targets: what export checks parity on


def test_greedy_generation_is_the_teacher_forced_argmax_and_settable_at_predict(
    trained: tuple[Path, CLI], tmp_path: Path
) -> None:
    """Each generated token is the argmax of the model's forward on the prompt and the tokens generated before it
    (the teacher-forced forward of the whole sequence gives them all at once: a causal model); the sampling settings
    are given at predict time without touching the checkpoint; the test loss is the token-weighted mean."""
    run, cli = trained
    task, dm = cli.model, cli.datamodule
    if not hasattr(task, "generate"):
        pytest.skip("this task's prediction is one forward pass, not a generation: the test of predict's columns "
                    "checks it")  # fmt: skip
    prompts = ["def main(", "import os"]
    (tmp_path / "prompts.txt").write_text("\n".join(prompts))
    main(["predict", "--config", str(run / "config.yaml"), f"--ckpt_path={run / 'checkpoints' / 'best.ckpt'}",
          f"--data.predict_path={tmp_path / 'prompts.txt'}", "--model.temperature=0",
          "--model.max_new_tokens=6"])  # fmt: skip
    with open(run / "predictions.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["input"] for r in rows] == prompts
    task.eval()
    settings = task.temperature, task.max_new_tokens
    task.temperature, task.max_new_tokens = 0.0, 6  # what predict was given
    try:
        inputs = dm.load_predict_inputs(tmp_path / "prompts.txt")  # the prompts' ids, as predict read them
        for i, row in enumerate(rows):
            ids = inputs[i][0][None]
            with torch.inference_mode():
                new = task.generate(ids)
                logits = task(torch.cat([ids, new], 1))
            # Up to where the net stops, if it does (a chat model's end of turn; the rest is padding).
            stops = [j + 1 for j, t in enumerate(new[0].tolist()) if t in getattr(task.net, "stop_ids", ())]
            n = stops[0] if stops else new.shape[1]
            assert torch.equal(logits[0, ids.shape[1] - 1 : -1].argmax(-1)[:n], new[0, :n])
            assert [row["generated"]] == task.prediction_table(new)[1][0]  # the task's own decoding
    finally:
        task.temperature, task.max_new_tokens = settings
    assert settings[1] != 6  # the checkpoint's own setting was another: predict's came from the command line
    outputs, targets = _outputs_by_hand(cli, "test")
    by_hand = _test_loss_by_hand(task, outputs, targets, dm.hparams["batch_size"])
    assert scalars(run)["test/loss"][0][1] == pytest.approx(by_hand, rel=1e-5)


@pytest.mark.guarantee(
    "a run directory copied where its training data is not predicts on files the same bytes and exports with the "
    "same parity (every shipped DataModule)"
)
def test_export_carries_the_contract_and_matches_the_checkpoint(trained: tuple[Path, CLI], tmp_path: Path) -> None:
    import onnxruntime

    from project.engine.inference.export import export

    original, cli = trained
    task, dm = cli.model, cli.datamodule
    run = tmp_path / "elsewhere" / original.name  # a copy, exported where the training data is not
    shutil.copytree(original, run)
    with _data_moved_away(cli, tmp_path):
        metadata = export(run / "checkpoints" / "best.ckpt")  # it checks its own parity: ParityError otherwise
    assert json.loads((run / "checkpoints" / "model.json").read_text()) == metadata
    assert metadata["output"] == json.loads(json.dumps(task.output_description()))
    named = dm.named_inputs
    sequences = not named and not dm.input_dtype.is_floating_point
    if dm.vocabulary:  # the tokenizer travels with the run: its vocabulary in the run directory, as plain JSON
        assert json.loads((run / "tokenizer.json").read_text())["vocabulary"] == dm.vocabulary
    if named:  # an exported input per named input, in the DataModule's order, each with its own statistics
        stats = dm.normalization or {}
        assert metadata["inputs"] == [
            {"name": n, "shape": ["batch", *shape], "dtype": str(dtype).removeprefix("torch."), "normalization":
             stats.get(n), "units": metadata["inputs"][i]["units"]}
            for i, (n, (shape, dtype)) in enumerate(named.items())
        ]  # fmt: skip
        described = metadata
    else:
        assert metadata["input"]["shape"] == ["batch", *(["sequence"] if sequences else dm.input_shape)]
        assert metadata["input"]["dtype"] == str(dm.input_dtype).removeprefix("torch.")
        assert metadata["input"].get("features") == dm.input_names  # a table's columns, in the order to feed them
        assert metadata["input"]["normalization"] == dm.normalization
        described = metadata["input"]
    # And what the DataModule says about building inputs from raw ones (a language model's prompt format).
    assert {k: described[k] for k in dm.input_description()} == json.loads(json.dumps(dm.input_description()))
    # Raw inputs in, the task's outputs out (the normalisation and the task's head are inside the exported model).
    inputs, _ = dm.split_tensors("test")
    session = onnxruntime.InferenceSession(str(run / "checkpoints" / "model.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == (list(named) if named else ["inputs"])
    outputs, _ = _outputs_by_hand(cli, "test")
    with torch.inference_mode():
        expected = task.output_head()(outputs)
    fed = {n: t.numpy() for n, t in inputs.items()} if named else {"inputs": inputs.numpy()}
    got = torch.from_numpy(session.run(None, fed)[0])
    if sequences:  # any length up to the declared one (a prompt, a text): the model's outputs on those ids
        for n in (1, 7, inputs.shape[1]):
            prefix = torch.from_numpy(session.run(None, {"inputs": inputs[:5, :n].numpy()})[0])
            with torch.inference_mode():
                want = task.output_head()(task.eval()(inputs[:5, :n]))
            torch.testing.assert_close(prefix, want, rtol=0, atol=1e-4 * max(1.0, expected.abs().max()))
    # float32 end to end: ~1e-7 relative per op; 1e-4 of the outputs' scale (their largest magnitude, at least 1)
    # leaves a wide margin whatever the units (logits of order 1-10, or values of order 1e4).
    scale = max(1.0, expected.abs().max().item())
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-4 * scale)


# On the default subject, the regression and the segmentation fixtures (~15 s a kernel): the notebook's three
# branches, a class per input, values, and a class per pixel; and on a task without targets (the inputs with the
# highest loss); its data-specific parts, show() and the target names, are checked on every subject above.
@pytest.mark.guarantee(
    "both notebooks run top to bottom on a real kernel on what `configs/default.yaml` selects (02 also training a "
    "tiny run when there is none, and on a regression and a segmentation run); committed without outputs"
)
# A kernel is a fresh interpreter (~8 s a run): in make test-all, on the user's config as on the other shapes.
@pytest.mark.parametrize("subject", _among("default", "regression", "segmentation", "gan", make_test=()), indirect=True)
def test_the_inspect_notebook_runs_on_the_run(trained: tuple[Path, CLI]) -> None:
    from conftest import PYTHONPATH
    from test_notebooks import _execute, _images, _text

    run, cli = trained
    # tests/ on the kernel's path: the engine's own fixtures (tests/shapes.py) are classes there
    notebook = _execute(
        ROOT / "notebooks" / "02_inspect_run.ipynb", {"PROJECT_RUN_DIR": str(run), "PYTHONPATH": PYTHONPATH}
    )
    judged = cli.model.monitor.replace("val/", "test/", 1)
    (_, logged), *_ = scalars(run)[judged]
    assert f"{judged} of best.ckpt: {logged:.4f} on" in _text(notebook)
    assert _images(notebook) >= 3


@pytest.mark.guarantee(
    "the inspect notebook on a copied run without its data scores the 32 test inputs the checkpoint keeps (the "
    "task's judged metric, equal to the one computed with the data) and says so"
)
@pytest.mark.parametrize("subject", _among("regression", make_test=()), indirect=True)
def test_the_inspect_notebook_scores_a_copied_run_on_the_test_inputs_its_checkpoint_keeps(
    trained: tuple[Path, CLI], tmp_path: Path
) -> None:
    from conftest import PYTHONPATH
    from test_notebooks import _execute, _images, _text

    run, cli = trained
    copy = tmp_path / "elsewhere" / run.name
    shutil.copytree(run, copy)
    with _data_moved_away(cli, tmp_path):  # tests/ on the kernel's path: the tests' recipe (tests/toy.py) is there
        notebook = _execute(
            ROOT / "notebooks" / "02_inspect_run.ipynb", {"PROJECT_RUN_DIR": str(copy), "PYTHONPATH": PYTHONPATH}
        )
    task, dm = load_run(run / "checkpoints" / "best.ckpt")  # what the notebook scores, computed here with the data
    inputs, targets = dm.split_tensors("test", EXAMPLES)
    with torch.inference_mode():
        outputs = task(dm.normalize(inputs))
    metrics = task.configure_metrics()
    task.update_metrics(metrics, outputs, targets)
    key = task.monitor.removeprefix("val/")
    text = _text(notebook)
    assert f"scoring the first {EXAMPLES} test inputs, kept in the checkpoint" in text
    assert f"test/{key} of best.ckpt: {float(metrics.compute()[key]):.4f} on {EXAMPLES} inputs" in text
    assert _images(notebook) >= 3
