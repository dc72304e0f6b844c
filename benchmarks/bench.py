"""`make bench`: the template's `fit` against the same training written by hand in plain PyTorch.

Both do the same work: the same network and initialisation (same seed), the same data in the same order (the
seeded DistributedSampler permutation of each epoch), batch size, AdamW with the same two param groups, the
warmup+cosine schedule stepped per optimizer step, gradient clipping at 1.0, and validation after every epoch.
The reference is a fair loop (zero_grad(set_to_none=True), no per-step .item()); the template runs with all its
default features on (logging, TensorBoard, metrics, checkpoints, the monitor, the progress bar).

Each run is a fresh process, alternating template and reference, so import and setup costs are real and neither
warms the other's caches. What is measured, so that a difference can be placed:
- steady state: the training part of each epoch after the first (first step to last step), per optimizer step;
- per epoch: the rest of the epoch (validation, checkpoint writes, logging), with each checkpoint save timed;
- start-up: process start to the first step, split into imports, CLI/config, setup and the first batch;
- the whole run: process start to the end of training.
The bench's own noise is the run-to-run spread of the hand-written loop (the same loop, run again).
Every process the bench starts gets the same fixed glibc malloc thresholds (``ALLOCATOR``): with glibc's adaptive
ones, a process could hand its tensors' memory back to the kernel and fault it in again at every step (1,200-2,300
page faults per step on the long workload, +30-50% step time), by how its earlier allocations went, not by its work.
Each run reports its page faults per step.

The fine-tuning workload (benchmarks/finetune.py, where the hf extra is installed) times SFT of a small Llama by the
template against a plain transformers loop, and LoRA against full fine-tuning.

A last workload times reading a table (``--table-rows``, a 30-column table as CSV and Parquet): pyarrow's own read
against the CSVDataModule's read and encoding, each in a fresh process, with its peak memory.

    python benchmarks/bench.py [--repeats 3] [--workloads default long] [--checkpoint-mb 240] [--table-rows N]
        [--finetune-steps 30]
"""

import argparse
import functools
import importlib.util
import json
import math
import os
import pkgutil
import platform
import random
import resource
import shlex
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from shipped_examples import present  # noqa: E402  (the shipped examples this repository still has)

CONFIG = str(ROOT / "configs" / "default.yaml")
# The sequence workload's text: the standard library's email package (~380 KB of Python, on every machine).
_EMAIL = str(Path(sysconfig.get_paths()["stdlib"]) / "email")
# Workloads: flags over the config. "default" is the config as it is (the shipped one has tiny steps, 20 per epoch:
# Lightning's fixed per-step and per-epoch costs show); "long" has >= 200 steps per epoch and a step of >= 20 ms on
# a 2-core CPU for the shipped ConvNet (6x wider, batch 6), as a real epoch has. Both runs of a workload read
# everything from the template's own objects (write_spec), so they do the same work whatever the data and net.
WORKLOADS = {
    "default": {"args": [], "epochs": 8},
    "long": {"args": ["--model.net.init_args.channels=192", "--data.batch_size=6"], "epochs": 3},
    # A step that is almost pure overhead (a 16-wide MLP on 8 samples): what the training loop itself costs.
    "floor": {"args": ["--model.net=project.nets.MLP", "--model.net.init_args.hidden=16", "--data.batch_size=8"],
              "epochs": 3},
    # The shipped GPT on byte tokens (configs/tasks/language_model.yaml, blocks of 64, batches of 32), on a text of
    # ~180 steps per epoch, validated at each epoch's end as the other workloads are; the loop is nanoGPT's.
    "sequence": {"args": ["--config", str(ROOT / "configs" / "tasks" / "language_model.yaml"), f"--data.path={_EMAIL}",
                          "--data.suffixes=[.py]", "--trainer.max_steps=-1", "--trainer.val_check_interval=1.0",
                          "--trainer.check_val_every_n_epoch=1"], "epochs": 3},
}  # fmt: skip
if not present("language_model"):  # deleted from this repository: no sequence workload
    del WORKLOADS["sequence"]
# The decomposition (--parts): each of the template's pieces, added one at a time to a bare Lightning fit of the same
# task and data, in this order, all in one process per workload. "template" is the whole trainer the CLI builds.
PARTS = ["logger", "LearningRateMonitor", "TrainingMonitor", "ThrottledProgressBar", "DivergenceGuard",
         "TaskCheckpoint", "LastCheckpoint", "TaskEarlyStopping"]  # fmt: skip
# Training batches per epoch in the decomposition (its rows are per step and per validation batch, so a shorter
# epoch changes no row, only how long the fits take).
PARTS_LIMIT = {"long": 70}
# Fixed glibc malloc thresholds for every process the bench starts (see the docstring); values already set win.
ALLOCATOR = {"MALLOC_MMAP_THRESHOLD_": str(32 * 2**20), "MALLOC_TRIM_THRESHOLD_": str(4 * 2**30)}
# --run-args: flags every run of every workload gets (e.g. "--trainer.precision=bf16-mixed --model.compile=true");
# the hand-written loop follows the precision and compile flags (autocast, torch.compile), as the template does.
RUN_ARGS: list[str] = []


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _cli(config: str, workload: str, epochs: int | None, save_dir: str | None = None, extra: tuple = ()) -> Any:
    from project.engine import CLI

    w = WORKLOADS[workload]
    return CLI(
        [
            "--config", config, *w["args"], *RUN_ARGS, f"--trainer.max_epochs={epochs or w['epochs']}",
            f"--trainer.logger.init_args.save_dir={save_dir or ROOT / 'benchmarks' / 'results' / 'logs'}",
            "--trainer.logger.init_args.name=bench", *extra,
        ],
        run=False,
    )  # fmt: skip


def write_spec(config: str, workload: str, epochs: int | None, path: Path, limit: int | None = None) -> None:
    """What the hand-written loop needs, read from the objects the template's CLI builds for the same config: the
    DataModule's splits as tensors and its normalisation (its contract), the net's class and arguments, and the
    recipe's hyperparameters. Saved as plain data and tensors, so the loop loads it without Lightning."""
    cli = _cli(config, workload, epochs)
    dm, model, trainer = cli.datamodule, cli.config.model.init_args, cli.config.trainer
    dm.setup("fit")
    task = type(cli.model).__name__
    if task not in RECIPES:
        raise SystemExit(f"error: the hand-written loop knows the tasks {sorted(RECIPES)}, not {task}.")
    if model.optimizer.class_path != "torch.optim.AdamW":
        raise SystemExit(f"error: the hand-written loop writes out AdamW, not {model.optimizer.class_path}.")
    optimizer = model.optimizer.init_args
    net_args = {**model.net.init_args.as_dict(), "input_shape": list(dm.input_shape), "num_outputs": dm.num_outputs}
    train, val = dm.split_tensors("train"), dm.split_tensors("val")
    spec = {
        "task": task, "monitor": cli.model.monitor,
        "train": train, "val": val, "normalization": dm.normalization,
        "tokens_per_sample": train[1][0].numel() if cli.model.counted == "tokens" else None,
        "flops_per_step": _flops_per_step(cli.model, dm.normalize(train[0][: dm.hparams["batch_size"]])),
        "net": {"class_path": model.net.class_path, "init_args": net_args},
        "lr": optimizer.lr, "warmup": model.warmup, "param_groups": _path_of(model.param_groups),
        "schedule": model.schedule.class_path, "schedule_args": model.schedule.init_args.as_dict(),
        "weight_decay": optimizer.weight_decay, "betas": list(optimizer.betas), "fused": optimizer.get("fused"),
        "clip": trainer.gradient_clip_val,
        "deterministic": trainer.deterministic, "precision": str(trainer.precision),
        "compile": model.get("compile", False),
        "batch_size": dm.hparams["batch_size"], "drop_last": dm.hparams["drop_last"],
        "seed": cli.config.seed_everything, "epochs": epochs or WORKLOADS[workload]["epochs"], "limit": limit,
        # For the bare Lightning fit: the same classes and arguments, built by hand (no CLI, callbacks or logger).
        "data": cli.config.data.as_dict(),
        "model": {"class_path": cli.config.model.class_path,
                  "init_args": {k: _path_of(v) for k, v in model.as_dict().items()
                                if k not in ("net", "target_names")}},
        "trainer": {k: v for k, v in trainer.as_dict().items()
                    if k not in ("logger", "callbacks", "plugins", "max_epochs")},
    }  # fmt: skip
    torch.save(spec, path)


def run_reference(spec_path: str | Path, workload: str = "default", t0: float | None = None) -> dict:
    """The hand-written loop. Imports no Lightning: only torch, and the project's network and schedule; the task's
    loss and metric are written out by hand (``RECIPES``)."""
    imported = time.time()

    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    from project.engine import resolve_warmup_steps

    spec = torch.load(spec_path, weights_only=True)
    device, seed, epochs, batch_size = _device(), spec["seed"], spec["epochs"], spec["batch_size"]
    random.seed(seed), np.random.seed(seed), torch.manual_seed(seed)  # what seed_everything does
    torch.use_deterministic_algorithms(spec["deterministic"])  # what trainer.deterministic does (~20% here)

    train_set = TensorDataset(*spec["train"])
    sampler = DistributedSampler(train_set, num_replicas=1, rank=0, shuffle=True, seed=seed, drop_last=True)
    # A generator of its own, as the template's loader has: creating an iterator then draws no global RNG.
    loader = DataLoader(train_set, batch_size=batch_size, sampler=sampler, generator=torch.Generator(),
                        drop_last=spec["drop_last"])  # fmt: skip
    # The val split through a DataLoader in order, batch by batch, as the DataModule serves it (a generator of its
    # own too, or each epoch's iterator would draw from the global RNG that dropout draws from).
    val_loader = DataLoader(TensorDataset(*spec["val"]), batch_size=batch_size, generator=torch.Generator())
    steps = min(len(loader), spec.get("limit") or len(loader))
    loss_of, score_of = RECIPES[spec["task"]](spec["train"][1].to(device))
    stats = spec["normalization"]  # applied on the device, as the DataModule's on_after_batch_transfer does
    view = (-1,) + (1,) * (spec["val"][0].ndim - 2)
    mean, std = torch.zeros((), device=device), torch.ones((), device=device)
    if stats:
        mean, std = (
            torch.tensor(stats[key], dtype=torch.float64, device=device).view(view).float() for key in ("mean", "std")
        )

    net = pkgutil.resolve_name(spec["net"]["class_path"])(**spec["net"]["init_args"]).to(device)
    if spec["compile"]:  # as the task compiles its net: in place, true = inductor, a string another backend
        net.compile(**({} if spec["compile"] is True else {"backend": spec["compile"]}))
    # bf16-mixed as Lightning's precision plugin runs it: the forward (and the loss) under autocast.
    autocast = functools.partial(torch.autocast, device.type, torch.bfloat16, spec["precision"].startswith("bf16"))
    # The config's parameter-group rule and schedule (project/recipe.py's by default), called as the engine calls them.
    rule = pkgutil.resolve_name(spec["param_groups"]) if spec["param_groups"] else None
    groups = rule(list(net.named_parameters())) if rule else [{"params": list(net.parameters())}]
    optimizer = torch.optim.AdamW(
        groups, lr=spec["lr"], betas=tuple(spec["betas"]), weight_decay=spec["weight_decay"], fused=spec["fused"]
    )
    total = steps * epochs
    warmup = resolve_warmup_steps(spec["warmup"], total)
    scheduler = pkgutil.resolve_name(spec["schedule"])(optimizer, total, warmup, **spec["schedule_args"])

    marks = {**_marks(t0), "imported": imported, "val_batches": len(val_loader)}
    for epoch in range(epochs):
        marks["epoch_start"].append(time.time())
        marks["cpu"].append([time.thread_time()])
        marks["faults"].append([_faults()])
        sampler.set_epoch(epoch)
        net.train()
        for step, (x, y) in enumerate(loader):
            if step == steps:
                break
            if "first_batch" not in marks:
                marks["first_batch"] = time.time()
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with autocast():
                loss = loss_of(net((x - mean) / std if stats else x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if spec["clip"]:
                torch.nn.utils.clip_grad_norm_(net.parameters(), spec["clip"])
            optimizer.step()
            scheduler.step()
            if "first_step_end" not in marks:
                marks["first_step_end"] = time.time()
        _synchronize()  # a GPU's queued steps are part of the epoch's training
        marks["train_end"].append(time.time())
        marks["faults"][-1].append(_faults())
        marks["cpu"][-1] += [time.thread_time()] * 2
        val_start = time.time()
        net.eval()
        with torch.no_grad(), autocast():
            outputs, targets = [], []
            for x, y in val_loader:
                x = x.to(device, non_blocking=True)
                outputs.append(net((x - mean) / std if stats else x))
                targets.append(y.to(device, non_blocking=True))
            val_metric = score_of(torch.cat(outputs), torch.cat(targets)).item()  # once per epoch
        marks["val"].append(time.time() - val_start)
        marks["cpu"][-1].append(time.thread_time())
    marks["end"] = time.time()
    return _result("reference", workload, batch_size, steps, marks, val_metric)


def _peak_flops(precision: str) -> float | None:
    """The device's peak FLOP/s for the precision's matmuls (Lightning's table of GPUs), None on a CPU."""
    if not torch.cuda.is_available():
        return None
    from lightning.fabric.utilities.throughput import get_available_flops

    from project.engine.observe.monitor import compute_dtype

    return get_available_flops(torch.device("cuda"), compute_dtype(precision))


def _synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _flops_per_step(task: Any, batch: torch.Tensor) -> int:
    """3 x the FLOPs of one batch's forward (the backward costs twice the forward), as TrainingMonitor counts."""
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        task.eval()(batch)
    return 3 * counter.get_total_flops()


def _path_of(value: Any) -> Any:
    """A function of the config (jsonargparse gives it imported) as its import path, saved as plain data."""
    return f"{value.__module__}.{value.__qualname__}" if callable(value) else value


def _classifier(train_targets: torch.Tensor) -> tuple[Any, Any]:
    """project.tasks.Classifier by hand: cross-entropy; accuracy."""
    return F.cross_entropy, lambda outputs, y: (outputs.argmax(-1) == y).float().mean()


def _regressor(train_targets: torch.Tensor) -> tuple[Any, Any]:
    """project.tasks.Regressor by hand: MSE on targets standardised by the training split; RMSE in their units."""
    y = train_targets.double().reshape(len(train_targets), -1)
    mean, std = y.mean(0).float(), y.std(0, correction=0).clamp_min(1e-12).float()

    def loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(outputs, (targets.reshape(outputs.shape) - mean) / std)

    def rmse(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return ((outputs * std + mean - targets.reshape(outputs.shape)) ** 2).mean().sqrt()

    return loss, rmse


def _language_model(train_targets: torch.Tensor) -> tuple[Any, Any]:
    """project.tasks.LanguageModel by hand, as nanoGPT's loop: the mean next-token cross-entropy over the batch's
    tokens (full blocks: the template's token weighting is this mean); the validation loss over every token."""

    def loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs.flatten(0, 1), targets.flatten())

    return loss, loss


# The tasks the hand-written loop can replay: (loss(outputs, targets), the judged metric(outputs, targets)).
RECIPES = {"Classifier": _classifier, "Regressor": _regressor, "LanguageModel": _language_model}


def _marks(t0: float | None) -> dict[str, Any]:
    """A run's timing marks: per epoch its start, the end of its training part and its validation's duration, and
    the main thread's CPU time at each of those points (``cpu``); ``t0`` is when its process started."""
    return {"t0": t0, "epoch_start": [], "train_end": [], "val": [], "cpu": [], "faults": []}


def _faults() -> int:
    """The process's page faults so far (minor ones: memory handed back by the allocator and touched again)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _clock(marks: dict[str, Any]) -> Any:
    """A callback writing the template's timing marks into ``marks`` (those the hand-written loop takes)."""
    import lightning as L

    class Clock(L.Callback):
        def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
            marks.setdefault("setup", time.time())

        def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            marks["epoch_start"].append(time.time())
            marks["cpu"].append([time.thread_time()])
            marks["faults"].append([_faults()])

        def on_train_batch_start(self, *_: object) -> None:
            marks.setdefault("first_batch", time.time())

        def on_train_batch_end(self, trainer: L.Trainer, module: Any, outputs: Any, batch: Any, index: int) -> None:
            if index == trainer.num_training_batches - 1:  # the epoch's last step: finished on a GPU
                _synchronize()
            marks.setdefault("first_step_end", time.time())
            self.last_batch_end, self.last_batch_end_cpu = time.time(), time.thread_time()

        def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            if not trainer.sanity_checking:
                marks["train_end"].append(self.last_batch_end)
                marks["val_batches"] = int(trainer.num_val_batches[0])
                self.val_start = time.time()
                marks["cpu"][-1] += [self.last_batch_end_cpu, time.thread_time()]
                marks["faults"][-1].append(_faults())  # here, not in every timed step

        def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            if not trainer.sanity_checking:
                marks["val"].append(time.time() - self.val_start)
                marks["cpu"][-1].append(time.thread_time())

        def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            marks["end"] = time.time()

    return Clock()


# The noise-free figure: Python function calls per training step, counted over COUNTED_STEPS steps of the second
# epoch (a multiple of the logging interval, 10, so logging steps count in their share; fewer in a shorter epoch).
# Load cannot move a count; the counting slows those steps, so it runs in a fit of its own, after the timed ones.
COUNTED_STEPS = 20


def _call_counter(found: dict[str, float]) -> Any:
    """A callback counting the Python calls of ``COUNTED_STEPS`` training steps of the second epoch (sys.setprofile:
    every call in the main thread, Lightning's loop, the callbacks, the task, torch's Python) into found["calls"]."""
    import lightning as L

    from project.engine import ThrottledProgressBar

    class CallCounter(L.Callback):
        calls = 0

        def count(self, frame: Any, event: str, arg: Any) -> None:
            if event == "call":
                self.calls += 1

        def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
            steps = min(COUNTED_STEPS, int(trainer.num_training_batches) - 2)  # a short epoch: all but its ends
            # The throttled bar redraws a few times a second, whatever the steps take: held still while counting
            # (its redraws depend on the clock, which the counting slows; the µs rows include them).
            if trainer.current_epoch == 1 and batch_idx in (1, 1 + steps):
                for bar in (cb for cb in trainer.callbacks if isinstance(cb, ThrottledProgressBar)):
                    bar._next_update = math.inf if batch_idx == 1 else 0.0
            if trainer.current_epoch == 1 and batch_idx == 1:
                sys.setprofile(self.count)
            elif trainer.current_epoch == 1 and batch_idx == 1 + steps:
                sys.setprofile(None)
                found["calls_per_step"] = self.calls / steps

    return CallCounter()


def _fit(cli: Any, marks: dict[str, Any], workload: str) -> dict:
    cli.trainer.callbacks.append(_clock(marks))
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    val_metric = float(cli.trainer.callback_metrics[cli.model.monitor])
    steps = int(cli.trainer.num_training_batches)
    return _result("template", workload, cli.datamodule.hparams["batch_size"], steps, marks, val_metric)


def run_template(
    config: str, workload: str, epochs: int | None = None, t0: float | None = None, save_dir: str | None = None
) -> dict:
    """The template's own `fit`, built by its CLI from the config, all its callbacks on."""
    marks = {**_marks(t0), "saves": []}
    from project.engine import CLI  # noqa: F401  (imported here so the import time is counted as imports)

    marks["imported"] = time.time()
    cli = _cli(config, workload, epochs, save_dir)
    marks["ready"] = time.time()
    io = cli.trainer.strategy.checkpoint_io
    save = io.save_checkpoint

    def timed_save(checkpoint: dict, path: Any, storage_options: Any = None) -> None:
        start = time.time()
        save(checkpoint, path, storage_options)
        size = Path(path).stat().st_size if Path(path).is_file() else 0
        marks["saves"].append({"s": time.time() - start, "mb": size / 2**20})

    io.save_checkpoint = timed_save  # type: ignore[method-assign]
    return _fit(cli, marks, workload)


def run_lightning(spec_path: str | Path, workload: str = "default", t0: float | None = None, scratch: str = "") -> dict:
    """A bare Lightning fit of the same task, data and net: built by hand from their classes and the config's
    arguments, a Trainer with the config's flags and Lightning's own logging, summary and checkpoints (TensorBoard,
    the step's learning rate, the best and the last checkpoint each epoch), no progress bar. What the template's
    start-up, steps and epochs are compared with, besides the hand-written loop: like with like, so that the gap shown
    is the template's own work (its curves, its checkpoints' fsync, its provenance)."""
    import lightning as L
    from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
    from lightning.pytorch.loggers import TensorBoardLogger

    spec = torch.load(spec_path, weights_only=True)
    data, task, net = spec["data"], spec["model"], spec["net"]
    data_class, task_class, net_class = (pkgutil.resolve_name(c["class_path"]) for c in (data, task, net))
    marks = {**_marks(t0), "imported": time.time()}
    L.seed_everything(spec["seed"], verbose=False)
    datamodule = data_class(**data["init_args"])
    recipe = {  # the optimizer and schedule as LightningCLI injects them: the class with the config's arguments
        key: functools.partial(pkgutil.resolve_name(part["class_path"]), **part["init_args"])
        for key, part in ((k, task["init_args"][k]) for k in ("optimizer", "schedule"))
    }
    if task["init_args"].get("param_groups"):  # the rule, imported by its path as LightningCLI does
        recipe["param_groups"] = pkgutil.resolve_name(task["init_args"]["param_groups"])
    model = task_class(net=net_class(**net["init_args"]), target_names=datamodule.target_names,
                       **{**task["init_args"], **recipe})  # fmt: skip
    parent = Path(scratch or ROOT / "benchmarks" / "results" / "logs")
    parent.mkdir(parents=True, exist_ok=True)
    root = tempfile.mkdtemp(prefix="bench-lightning-", dir=parent)
    best = ModelCheckpoint(dirpath=root, filename="best", monitor=model.monitor, mode=model.mode, save_last=True)
    flags = {**spec["trainer"], "max_epochs": spec["epochs"], "default_root_dir": root,
             "logger": TensorBoardLogger(root, name="bench", default_hp_metric=False),
             "callbacks": [_clock(marks), best, LearningRateMonitor(logging_interval="step")],
             "enable_progress_bar": False}  # fmt: skip
    if spec.get("limit"):
        flags["limit_train_batches"] = spec["limit"]
    trainer = L.Trainer(**flags)
    marks["ready"] = time.time()
    trainer.fit(model, datamodule=datamodule)
    val_metric = float(trainer.callback_metrics[model.monitor])
    return _result("lightning", workload, spec["batch_size"], int(trainer.num_training_batches), marks, val_metric)


def _variant(cli: Any, n: int, variant: str) -> Any:
    """The CLI's trainer as the decomposition's row ``n`` has it: bare Lightning plus the first ``n - 1`` of
    ``PARTS`` (the template keeps everything); or "lightning+callbacks": the logger and Lightning's own callbacks
    as a bare Lightning run has them (the best and the last checkpoint, early stopping, the step's learning rate, its
    default progress bar and model summary), what the template's per-step cost is judged against."""
    if variant == "template+EMA":  # the template with an average of the weights (project.engine.EMA, its default)
        from project.engine import EMA

        cli.trainer.callbacks.append(EMA())
    elif variant == "lightning+callbacks":
        from lightning.pytorch import callbacks as lc

        task, root = cli.model, cli.trainer.default_root_dir
        cli.trainer.callbacks = [
            lc.ModelCheckpoint(dirpath=root, filename="best", monitor=task.monitor, mode=task.mode, save_last=True),
            lc.EarlyStopping(monitor=task.monitor, mode=task.mode, patience=10),
            lc.LearningRateMonitor(logging_interval="step"), lc.TQDMProgressBar(), lc.ModelSummary(),
        ]  # fmt: skip
    elif variant not in ("template", "template+EMA"):
        kept = PARTS[: n - 1]
        if "logger" not in kept:
            cli.trainer.loggers = []
        cli.trainer.callbacks = [cb for cb in cli.trainer.callbacks if type(cb).__name__ in kept]
    return cli


def run_parts(config: str, workload: str, rounds: int, out: str) -> dict[str, dict[str, float]]:
    """The decomposition of one workload: the hand-written loop, a bare Lightning fit of the same task and data (the
    CLI's trainer with no callback and no logger), then one more of the template's parts (``PARTS``) at a time, and
    the template whole; ``rounds`` times in turn, in this one process. Returns µs per training step (epochs after
    the first) and per validation batch, medians over rounds, per variant, with its final validation metric (the
    same model for all: no part changes what is learnt) and the parts it has (``has``)."""
    limit = PARTS_LIMIT.get(workload)
    epochs = WORKLOADS[workload]["epochs"]
    variants = [
        "reference",
        "lightning",
        *(f"+{part}" for part in PARTS),
        "template",
        "template+EMA",
        "lightning+callbacks",
    ]
    found: dict[str, dict[str, list[float]]] = {v: defaultdict(list) for v in variants}
    with tempfile.TemporaryDirectory(dir=out) as scratch:
        spec = Path(scratch) / "spec.pt"
        write_spec(config, workload, epochs, spec, limit)
        extra = (f"--trainer.default_root_dir={scratch}", *([f"--trainer.limit_train_batches={limit}"] * bool(limit)))
        for _ in range(rounds):
            for n, variant in enumerate(variants):
                if variant == "reference":
                    result = run_reference(spec, workload)
                else:
                    cli = _variant(_cli(config, workload, epochs, scratch, extra), n, variant)
                    result = _fit(cli, _marks(None), workload)
                    found[variant]["has"] = ["logger"] * bool(cli.trainer.loggers) + [
                        type(cb).__name__ for cb in cli.trainer.callbacks if type(cb).__name__ != "Clock"
                    ]
                for key, values, per in (
                    ("step_us", "ms_per_step", 1), ("val_batch_us", "val_ms", result["val_batches"]),
                    ("cpu_step_us", "cpu_ms_per_step", 1), ("cpu_val_batch_us", "cpu_val_ms", result["val_batches"]),
                ):  # fmt: skip
                    found[variant][key].append(1e3 * statistics.median(result[values]) / per)
                found[variant]["val_metric"].append(result["val_metric"])
        for n, variant in enumerate(variants[1:], start=1):  # the count, once each (it is the same every time)
            cli = _variant(_cli(config, workload, epochs, scratch, extra), n, variant)
            counted: dict[str, float] = {}
            cli.trainer.callbacks.append(_call_counter(counted))
            cli.trainer.fit(cli.model, datamodule=cli.datamodule)
            found[variant]["calls_per_step"] = [counted["calls_per_step"]]
    return {v: {k: xs if k == "has" else statistics.median(xs) for k, xs in m.items()} for v, m in found.items()}


def _result(kind: str, workload: str, batch_size: int, steps_per_epoch: int, marks: dict, val_metric: float) -> dict:
    starts, train_ends = marks["epoch_start"], marks["train_end"]
    # Steady state: an epoch's training part, first step to last, after the first epoch (warm-up).
    per_step = [1e3 * (e - s) / steps_per_epoch for s, e in zip(starts[1:], train_ends[1:], strict=True)]
    # The rest of each epoch: from its last step to the next epoch's start (or the end of training).
    epoch_ends = [*starts[1:], marks["end"]]
    fixed = [1e3 * (b - a) for a, b in zip(train_ends[1:], epoch_ends[1:], strict=True)]
    t0 = marks["t0"]
    startup = None
    if t0 is not None:
        if kind != "reference":
            startup = {"imports": marks["imported"] - t0, "cli_config": marks["ready"] - marks["imported"],
                       "setup": marks["first_batch"] - marks["ready"],
                       "first_batch": marks["first_step_end"] - marks["first_batch"]}  # fmt: skip
        else:
            startup = {"imports": marks["imported"] - t0, "cli_config": 0.0,
                       "setup": marks["first_batch"] - marks["imported"],
                       "first_batch": marks["first_step_end"] - marks["first_batch"]}  # fmt: skip
    return {
        "kind": kind,
        "workload": workload,
        "steps_per_epoch": steps_per_epoch,
        "ms_per_step": per_step,
        "epoch_fixed_ms": fixed,
        "val_ms": [1e3 * v for v in marks["val"][1:]],
        "val_batches": marks["val_batches"],
        # The main thread's CPU time (thread_time) per step and per epoch's validation: what other processes on the
        # machine barely change (wall time counts the time they hold the cores).
        "cpu_ms_per_step": [1e3 * (c[1] - c[0]) / steps_per_epoch for c in marks["cpu"][1:]],
        "cpu_val_ms": [1e3 * (c[3] - c[2]) for c in marks["cpu"][1:]],
        "faults_per_step": [(f[1] - f[0]) / steps_per_epoch for f in marks["faults"][1:]],
        "saves": marks.get("saves", []),
        "samples_per_sec": batch_size * 1e3 / statistics.median(per_step),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "val_metric": val_metric,
        "startup_s": startup,
        "time_to_first_step_s": None if t0 is None else marks["first_batch"] - t0,
        "whole_run_s": None if t0 is None else marks["end"] - t0,
    }


def data_path(config: str, workload: str, epochs: int = 5) -> float:
    """Batches per second the config's train DataLoader delivers on its own (nothing trains)."""
    dm = _cli(config, workload, None).datamodule
    dm.setup("fit")
    loader = dm.train_dataloader()
    start, batches = time.perf_counter(), 0
    for _ in range(epochs):
        batches += sum(1 for _ in loader)
    return batches / (time.perf_counter() - start)


def _after_first_step(summary: dict[str, Any]) -> float:
    return summary["whole_run_s"]["median"] - summary["first_step_s"]["median"]


def _stats(values: list[float]) -> dict[str, float]:
    median = statistics.median(values)
    return {"median": median, "min": min(values), "max": max(values),
            "spread_pct": 100 * (max(values) - min(values)) / median if median else 0.0}  # fmt: skip


def _mmm(stats: dict[str, float], digits: int) -> str:
    return f"{stats['median']:.{digits}f} [{stats['min']:.{digits}f}-{stats['max']:.{digits}f}]"


def _summarise(rs: list[dict]) -> dict[str, Any]:
    """One loop's runs: medians over runs of each run's median (so one slow epoch does not swamp a run)."""
    saves = [s for r in rs for s in r["saves"]]
    per_epoch = len(saves) / sum(len(r["epoch_fixed_ms"]) + 1 for r in rs) if saves else 0
    save_s = statistics.median(s["s"] for s in saves) if saves else 0.0
    save_mb = statistics.median(s["mb"] for s in saves) if saves else 0.0
    startup = {k: statistics.median(r["startup_s"][k] for r in rs) for k in rs[0]["startup_s"]}
    return {
        "step_ms": _stats([statistics.median(r["ms_per_step"]) for r in rs]),
        "epoch_fixed_ms": _stats([statistics.median(r["epoch_fixed_ms"]) for r in rs]),
        "val_ms": statistics.median(v for r in rs for v in r["val_ms"]),
        "saves": {
            "count": round(per_epoch, 1),
            "ms": 1e3 * save_s,
            "mb": save_mb,
            "mb_per_s": save_mb / save_s if save_s else 0.0,
        },
        "faults_per_step": statistics.median(statistics.median(r["faults_per_step"]) for r in rs),
        "first_step_s": _stats([r["time_to_first_step_s"] for r in rs]),
        "whole_run_s": _stats([r["whole_run_s"] for r in rs]),
        "startup": startup,
        "samples_per_sec": statistics.median(r["samples_per_sec"] for r in rs),
        "peak_rss_mb": max(r["peak_rss_mb"] for r in rs),
        "val_metric": [round(r["val_metric"], 6) for r in rs],
    }


def checkpoint_stall(size_mb: int, out: Path, saves: int = 4, interval_s: float = 1.5) -> dict:
    """How long each checkpoint save stalls the training thread: the blocking atomic writer (serialise, write,
    fsync, rename) against the background writer (a copy to host memory; the rest in a thread). The state is
    ``size_mb`` of float32 on the run's device (weights and two AdamW moments, as a checkpoint holds); between saves
    the training thread sleeps ``interval_s`` (a GPU step: the host is free), so the background write can finish."""
    from project.engine import AtomicCheckpointIO, BackgroundCheckpointIO

    n = size_mb * 2**20 // 4 // 3
    state = {"state_dict": {"w": torch.randn(n, device=_device())},
             "optimizer_states": [{"exp_avg": torch.randn(n, device=_device()),
                                   "exp_avg_sq": torch.rand(n, device=_device())}]}  # fmt: skip
    result: dict[str, Any] = {"size_mb": size_mb, "saves": saves}
    with tempfile.TemporaryDirectory(dir=out) as scratch:
        for name, io in (("atomic", AtomicCheckpointIO()), ("background", BackgroundCheckpointIO())):
            stalls = []
            for _ in range(saves):
                start = time.perf_counter()
                io.save_checkpoint(state, Path(scratch) / f"{name}.ckpt")
                stalls.append(time.perf_counter() - start)
                time.sleep(interval_s)
            io.teardown()
            written = (Path(scratch) / f"{name}.ckpt").stat().st_size / 2**20
            result[name] = {"stall_ms": [round(1e3 * x, 1) for x in stalls], "file_mb": round(written, 1)}
    atomic = statistics.median(result["atomic"]["stall_ms"])
    result["atomic"]["mb_per_s"] = round(result["atomic"]["file_mb"] / (atomic / 1e3), 1)
    return result


def write_table(rows: int, folder: Path) -> tuple[Path, Path]:
    """A churn-like table as CSV and Parquet: 24 numeric columns (5% missing in 3), 5 category columns of 3-20
    values and a yes/no target: 30 columns, the shape the issue measured."""
    import pyarrow as pa
    import pyarrow.csv as pa_csv
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    columns: dict[str, Any] = {}
    for i in range(24):
        values = rng.normal(size=rows).round(4)
        columns[f"x{i}"] = pa.array(values, mask=rng.random(rows) < 0.05 if i < 3 else None)
    for i, count in enumerate((3, 4, 6, 12, 20)):
        columns[f"c{i}"] = pa.array(np.array([f"v{j}" for j in range(count)])[rng.integers(0, count, rows)])
    columns["churn"] = pa.array(np.where(rng.random(rows) < 0.2, "yes", "no"))
    table = pa.table(columns)
    pa_csv.write_csv(table, folder / "table.csv")
    pq.write_table(table, folder / "table.parquet")
    return folder / "table.csv", folder / "table.parquet"


def load_table(kind: str, path: str) -> dict:
    """One way of loading the table, in this process: pyarrow's own read, or the CSVDataModule's read and encoding
    (the columns' categories, medians and missing indicators from the training split, then every row encoded)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pa_csv
    import pyarrow.parquet as pq

    pc.cast(pa.array([1]), pa.float64())  # imports excluded from both (pyarrow's compute imports pandas if it can)
    if kind == "pyarrow":
        start = time.perf_counter()
        table = pq.read_table(path) if path.endswith(".parquet") else pa_csv.read_csv(path)
        seconds, shape = time.perf_counter() - start, (table.num_rows, table.num_columns)
    else:
        from project.data import CSVDataModule

        start = time.perf_counter()
        dm = CSVDataModule(path=path, target="churn")
        seconds, shape = time.perf_counter() - start, tuple(dm.inputs.shape)
    return {"s": seconds, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "shape": shape}


def table_loading(rows: int, repeats: int) -> dict:
    """The table-loading workload: each reader of each file in a fresh process (alternating), its time and peak
    memory (the process's maximum resident set, imports included)."""
    result: dict[str, Any] = {"rows": rows}
    with tempfile.TemporaryDirectory() as scratch:
        files = dict(zip(("csv", "parquet"), write_table(rows, Path(scratch)), strict=True))
        result["csv_mb"] = round(files["csv"].stat().st_size / 2**20, 1)
        found: dict[str, list[dict]] = defaultdict(list)
        for _ in range(repeats):
            for fmt, path in files.items():
                for kind in ("pyarrow", "template"):
                    out = subprocess.run([sys.executable, __file__, "--one", "table", "--spec", f"{kind}:{path}"],
                                         cwd=ROOT, capture_output=True, text=True, check=True)  # fmt: skip
                    found[f"{kind}/{fmt}"].append(json.loads(out.stdout.strip().splitlines()[-1]))
    for name, runs in found.items():
        result[name] = {"s": statistics.median(r["s"] for r in runs), "peak_mb": max(r["peak_mb"] for r in runs),
                        "shape": runs[0]["shape"]}  # fmt: skip
    result["csv_ratio"] = result["template/csv"]["s"] / result["pyarrow/csv"]["s"]
    result["parquet_ratio"] = result["template/parquet"]["s"] / result["pyarrow/csv"]["s"]
    return result


def _one(kind: str, config: str, workload: str, epochs: int | None, spec: Path, results: str) -> dict:
    """A run in a fresh process; its time to first step counts from the moment it was started."""
    t0 = time.time()
    out = subprocess.run(
        [sys.executable, __file__, "--one", kind, "--config", config, "--workload", workload, "--t0", repr(t0),
         "--spec", str(spec), "--out", results, *(["--epochs", str(epochs)] if epochs else []),
         f"--run-args={shlex.join(RUN_ARGS)}"],  # "=": argparse takes no separate value that starts with "-"
        cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )  # fmt: skip
    if out.returncode != 0:
        raise SystemExit(f"{kind}/{workload} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workloads", nargs="*", default=["default", "long"], choices=list(WORKLOADS))
    parser.add_argument("--parts", nargs="*", default=["floor", "long"], choices=list(WORKLOADS),
                        help="workloads to decompose part by part (none: skip)")  # fmt: skip
    parser.add_argument("--epochs", type=int, default=None, help="override each workload's epoch count")
    parser.add_argument("--config", default=CONFIG, help="the run to measure (default: configs/default.yaml)")
    parser.add_argument("--checkpoint-mb", type=int, default=240, help="checkpoint stall test size (0: skip)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"), help="where the JSON report goes")
    parser.add_argument("--table-rows", type=int, default=1_000_000, help="table-loading workload's rows (0: skip)")
    parser.add_argument("--finetune-steps", type=int, default=30,
                        help="fine-tuning steps (benchmarks/finetune.py, needs the hf extra; 0: skip)")  # fmt: skip
    parser.add_argument(
        "--run-args",
        default="",
        help="flags for every run, e.g. --run-args='--trainer.precision=bf16-mixed --model.compile=true' (the "
        "hand-written loop autocasts and compiles as they say)",
    )
    parser.add_argument("--one", choices=["template", "lightning", "reference", "parts", "table"],
                        help=argparse.SUPPRESS)  # fmt: skip
    parser.add_argument("--spec", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--workload", default="default", help=argparse.SUPPRESS)
    parser.add_argument("--t0", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    RUN_ARGS[:] = shlex.split(args.run_args)
    if args.one:  # a child: one run, its result as the last line of stdout
        if args.one == "template":
            print(json.dumps(run_template(args.config, args.workload, args.epochs, args.t0, f"{args.out}/logs")))
        elif args.one == "lightning":
            print(json.dumps(run_lightning(args.spec, args.workload, args.t0, f"{args.out}/logs")))
        elif args.one == "table":
            kind, path = args.spec.split(":", 1)
            print(json.dumps(load_table(kind, path)))
        elif args.one == "parts":
            print(json.dumps(run_parts(args.config, args.workload, args.repeats, args.out)))
        else:
            print(json.dumps(run_reference(args.spec, args.workload, args.t0)))
        return

    for name, value in ALLOCATOR.items():  # inherited by every run's process (glibc reads them at its start)
        os.environ.setdefault(name, value)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    rows, runs = [], []
    kinds = ("reference", "lightning", "template")
    for workload in args.workloads:
        results: dict[str, list[dict]] = {kind: [] for kind in kinds}
        with tempfile.TemporaryDirectory() as scratch:
            spec = Path(scratch) / "spec.pt"
            write_spec(args.config, workload, args.epochs, spec)
            facts = {k: v for k, v in torch.load(spec, weights_only=True).items()
                     if k in ("flops_per_step", "tokens_per_sample", "batch_size", "precision", "compile")}  # fmt: skip
            for _ in range(args.repeats):
                for kind in kinds:
                    results[kind].append(_one(kind, args.config, workload, args.epochs, spec, args.out))
        runs += [r for kind in kinds for r in results[kind]]
        summary = {kind: _summarise(rs) for kind, rs in results.items()}
        ref, bare, tpl = summary["reference"], summary["lightning"], summary["template"]
        peak = _peak_flops(facts["precision"])
        rows.append({
            "workload": workload, **summary, "steps_per_epoch": results["template"][0]["steps_per_epoch"],
            "precision": facts["precision"], "compile": facts["compile"], "batch_size": facts["batch_size"],
            # Model FLOPs utilisation: the step's FLOPs (3 x the forward's) at the measured step rate over the
            # device's peak for the precision (Lightning's table of GPUs; none for a CPU).
            **{f"{kind}_mfu": facts["flops_per_step"] * 1e3 / summary[kind]["step_ms"]["median"] / peak
               for kind in kinds if peak},
            "step_overhead_ms": tpl["step_ms"]["median"] - ref["step_ms"]["median"],
            "step_overhead_pct": 100 * (tpl["step_ms"]["median"] / ref["step_ms"]["median"] - 1),
            "epoch_overhead_ms": tpl["epoch_fixed_ms"]["median"] - ref["epoch_fixed_ms"]["median"],
            "whole_run_ratio": tpl["whole_run_s"]["median"] / ref["whole_run_s"]["median"],
            "training_ratio": _after_first_step(tpl) / _after_first_step(ref),
            "first_step_over_lightning_s": tpl["first_step_s"]["median"] - bare["first_step_s"]["median"],
            "noise_pct": ref["step_ms"]["spread_pct"],
            "data_path_batches_per_sec": data_path(args.config, workload),
            "flops_per_step": facts["flops_per_step"],
            # Counted tokens per second (a token task's): the same tokens per step in both, so their ratio is the
            # steps' (the issue's bar: the template >= 0.9x the hand-written loop).
            **({f"{kind}_tokens_per_sec": facts["tokens_per_sample"] * facts["batch_size"] * 1e3
                / summary[kind]["step_ms"]["median"] for kind in kinds} if facts["tokens_per_sample"] else {}),
        })  # fmt: skip
    parts = {}
    for workload in args.parts:
        out = subprocess.run(
            [sys.executable, __file__, "--one", "parts", "--config", args.config, "--workload", workload,
             "--repeats", str(args.repeats), "--out", args.out, f"--run-args={args.run_args}"],
            cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )  # fmt: skip
        if out.returncode != 0:
            raise SystemExit(f"parts/{workload} failed:\n{out.stderr[-3000:]}")
        parts[workload] = json.loads(out.stdout.strip().splitlines()[-1])

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU, {os.cpu_count()} cores"
    print(f"\nmake bench, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {device}, torch {torch.__version__}, "
          f"{args.repeats} runs each, alternating; medians [min-max] over runs\n")  # fmt: skip
    for row in rows:
        ref, bare, tpl = row["reference"], row["lightning"], row["template"]
        print(f"{row['workload']}: {row['steps_per_epoch']} steps per epoch")
        for kind in kinds:
            r, up = row[kind], row[kind]["startup"]
            print(
                f"  {kind:9}  step {_mmm(r['step_ms'], 2)} ms ({r['faults_per_step']:.0f} page faults)   "
                f"per epoch {_mmm(r['epoch_fixed_ms'], 1)} ms "
                f"(val {r['val_ms']:.1f})   first step {r['first_step_s']['median']:.2f} s (imports "
                f"{up['imports']:.2f}, CLI/config {up['cli_config']:.2f}, setup {up['setup']:.2f}, first batch "
                f"{up['first_batch']:.3f})   whole run {_mmm(r['whole_run_s'], 2)} s   val metric {r['val_metric']}"
            )
        saves = tpl["saves"]
        save_text = "no checkpoint saves"
        if saves["count"]:
            save_text = (f"{saves['count']} checkpoint saves per epoch, {saves['ms']:.1f} ms each "
                         f"({saves['mb']:.2f} MB, {saves['mb_per_s']:.0f} MB/s with fsync)")  # fmt: skip
        print(f"  => steady-state step: {row['step_overhead_ms']:+.2f} ms ({row['step_overhead_pct']:+.1f}%); "
              f"per epoch: {row['epoch_overhead_ms']:+.1f} ms ({save_text}); whole run "
              f"{row['whole_run_ratio']:.2f}x (after the first step: {row['training_ratio']:.2f}x); first step "
              f"{row['first_step_over_lightning_s']:+.2f} s after bare Lightning's; noise: the reference's "
              f"run-to-run spread {row['noise_pct']:.1f}%; data path alone "
              f"{row['data_path_batches_per_sec']:.0f} batches/s; {row['flops_per_step']:.3g} FLOPs per step "
              f"(3 x the forward's: FlopCounterMode)")  # fmt: skip
        if "template_mfu" in row:
            print(
                f"  => MFU ({row['precision']}, compile {row['compile']}): template {row['template_mfu']:.1%}, "
                f"hand-written loop {row['reference_mfu']:.1%}, bare Lightning {row['lightning_mfu']:.1%}"
            )
        if "template_tokens_per_sec" in row:
            mine, loop = row["template_tokens_per_sec"], row["reference_tokens_per_sec"]
            print(f"  => tokens/s: template {mine:.0f}, hand-written loop {loop:.0f} ({mine / loop:.2f}x), bare "
                  f"Lightning {row['lightning_tokens_per_sec']:.0f}")  # fmt: skip
        print()
    for workload, found in parts.items():
        print(f"{workload}, part by part (one process; each row adds one part to the row above): µs per training "
              "step and per validation batch, wall clock [main thread's CPU time]; Python calls per training step "
              "(a count: the machine's load cannot move it), and what each row adds")  # fmt: skip
        above = None  # the hand-written loop adds nothing to a row: it is a loop of its own
        for variant, m in found.items():
            above = found["lightning"] if variant == "lightning+callbacks" else above  # a row beside bare Lightning
            added, calls = "", f"{m['calls_per_step']:8.0f}" if "calls_per_step" in m else " " * 8
            if above is not None:
                added = (f"{m['step_us'] - above['step_us']:+7.0f} {m['val_batch_us'] - above['val_batch_us']:+7.0f} "
                         f"{m['calls_per_step'] - above['calls_per_step']:+7.0f} calls")  # fmt: skip
            print(f"  {variant:22} {m['step_us']:8.0f} [{m['cpu_step_us']:6.0f}] {m['val_batch_us']:7.0f} "
                  f"[{m['cpu_val_batch_us']:6.0f}] {calls}   {added}")  # fmt: skip
            above = m if variant != "reference" else None
        ref, bare, tpl, same = (found[k] for k in ("reference", "lightning", "template", "lightning+callbacks"))
        ratios = [tpl[k] / same[k] for k in ("calls_per_step", "step_us", "val_batch_us")]
        ema = found["template+EMA"]
        print(f"  => EMA (decay 0.999): {ema['step_us'] / tpl['step_us'] - 1:+.1%} per step over the template, "
              f"{ema['calls_per_step'] - tpl['calls_per_step']:+.0f} calls")  # fmt: skip
        print("  => template / Lightning with its own callbacks: {:.2f}x the calls per step, {:.2f}x per step, "
              "{:.2f}x per validation batch".format(*ratios))  # fmt: skip
        print(f"  => template / bare Lightning: {tpl['calls_per_step'] / bare['calls_per_step']:.2f}x the calls per "
              f"step, {tpl['step_us'] / bare['step_us']:.2f}x per step, "
              f"{tpl['val_batch_us'] / bare['val_batch_us']:.2f}x per validation batch; template / hand-written "
              f"loop: {tpl['step_us'] / ref['step_us']:.2f}x per step, "
              f"{tpl['val_batch_us'] / ref['val_batch_us']:.2f}x per validation batch\n")  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stall = checkpoint_stall(args.checkpoint_mb, out) if args.checkpoint_mb else None
    if stall:
        for name in ("atomic", "background"):
            print(
                f"checkpoint of {stall[name]['file_mb']:.0f} MB, {name:10} writer: training stalled "
                f"{statistics.median(stall[name]['stall_ms']):7.1f} ms per save (each: {stall[name]['stall_ms']})"
            )
        print(f"(the blocking writer writes {stall['atomic']['mb_per_s']:.0f} MB/s here, fsync included)\n")
    table = table_loading(args.table_rows, args.repeats) if args.table_rows and present("table") else None
    if table:
        print(f"table loading, {table['rows']} rows x 30 columns ({table['csv_mb']:.0f} MB of CSV), fresh processes:")
        for name in ("pyarrow/csv", "template/csv", "pyarrow/parquet", "template/parquet"):
            print(f"  {name:17} {table[name]['s']:6.2f} s, peak memory {table[name]['peak_mb']:6.0f} MB  "
                  f"-> {table[name]['shape']}")  # fmt: skip
        print(f"  => read and encoded: the CSV in {table['csv_ratio']:.2f}x pyarrow's own read of it, the Parquet "
              f"file in {table['parquet_ratio']:.2f}x\n")  # fmt: skip
    finetune = None
    if args.finetune_steps and present("sft") and importlib.util.find_spec("transformers"):
        import finetune as finetune_workload  # benchmarks/finetune.py

        finetune = finetune_workload.workload(args.finetune_steps, args.repeats)
        finetune_workload.report(finetune)
    path = out / f"bench-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}.json"
    path.write_text(json.dumps({"device": device, "torch": torch.__version__, "python": platform.python_version(),
                                "run_args": args.run_args,
                                "rows": rows, "parts": parts, "runs": runs, "checkpoint_stall": stall,
                                "table_loading": table, "finetune": finetune},
                               indent=2))  # fmt: skip
    print(f"Wrote {path}")


if __name__ == "__main__":
    main()
