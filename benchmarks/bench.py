"""`make bench`: the template's `fit` against the same training written by hand in plain PyTorch.

Both do the same work: the same network and initialisation (same seed), the same data in the same order (the
seeded DistributedSampler permutation of each epoch), batch size, AdamW with the same two param groups, the
warmup+cosine schedule stepped per optimizer step, gradient clipping at 1.0, and validation after every epoch.
The reference is a fair loop (zero_grad(set_to_none=True), no per-step .item()); the template runs with all its
default features on (logging, TensorBoard, metrics, checkpoints, the monitor, the progress bar).

Each run is a fresh process, alternating template and reference, so import and setup costs are real and neither
warms the other's caches. Per run: the wall time of each epoch after the first (training + validation), divided
by its optimizer steps.

    python benchmarks/bench.py [--repeats 3] [--workloads default heavy]
"""

import argparse
import itertools
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
CONFIG = str(ROOT / "configs" / "default.yaml")
# Workloads: flags over the config. "default" is the config as it is (the shipped one has tiny steps: Lightning's fixed
# per-step cost shows); "heavy" has a step of >= 10 ms on a 2-core CPU for the shipped ConvNet (3x wider, 4x the
# batch). Both runs of a workload read everything from the template's own objects (write_spec), so they do the
# same work whatever the config's data and net.
WORKLOADS = {
    "default": {"args": [], "epochs": 8},
    "heavy": {"args": ["--model.net.init_args.channels=96", "--data.batch_size=256"], "epochs": 4},
}


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _cli(config: str, workload: str, epochs: int | None, save_dir: str | None = None) -> Any:
    from project.cli import CLI

    w = WORKLOADS[workload]
    return CLI(
        [
            "--config", config, *w["args"], f"--trainer.max_epochs={epochs or w['epochs']}",
            f"--trainer.logger.init_args.save_dir={save_dir or ROOT / 'benchmarks' / 'results' / 'logs'}",
            "--trainer.logger.init_args.name=bench",
        ],
        run=False,
    )  # fmt: skip


def write_spec(config: str, workload: str, epochs: int | None, path: Path) -> None:
    """What the hand-written loop needs, read from the objects the template's CLI builds for the same config: the
    DataModule's splits as tensors and its normalisation (its contract), the net's class and arguments, and the
    recipe's hyperparameters. Saved as plain data and tensors, so the loop loads it without Lightning."""
    cli = _cli(config, workload, epochs)
    dm, model, trainer = cli.datamodule, cli.config.model, cli.config.trainer
    dm.setup("fit")
    net_args = {**model.net.init_args.as_dict(), "input_shape": list(dm.input_shape), "num_classes": dm.num_classes}
    spec = {
        "train": dm.split_tensors("train"), "val": dm.split_tensors("val"), "normalization": dm.normalization,
        "net": {"class_path": model.net.class_path, "init_args": net_args},
        "lr": model.lr, "min_lr": model.min_lr, "warmup": model.warmup, "weight_decay": model.weight_decay,
        "betas": list(model.betas), "clip": trainer.gradient_clip_val, "deterministic": trainer.deterministic,
        "batch_size": dm.hparams["batch_size"], "drop_last": dm.hparams["drop_last"],
        "seed": cli.config.seed_everything, "epochs": epochs or WORKLOADS[workload]["epochs"],
    }  # fmt: skip
    torch.save(spec, path)


def run_reference(spec_path: str | Path, workload: str = "default", t0: float | None = None) -> dict:
    """The hand-written loop. Imports no Lightning: only torch, and the project's network and schedule."""
    import importlib

    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    from project.schedule import WarmupCosine, resolve_warmup_steps

    spec = torch.load(spec_path, weights_only=True)
    device, seed, epochs, batch_size = _device(), spec["seed"], spec["epochs"], spec["batch_size"]
    random.seed(seed), np.random.seed(seed), torch.manual_seed(seed)  # what seed_everything does
    torch.use_deterministic_algorithms(spec["deterministic"])  # what trainer.deterministic does (~20% here)

    train_set = TensorDataset(*spec["train"])
    sampler = DistributedSampler(train_set, num_replicas=1, rank=0, shuffle=True, seed=seed, drop_last=True)
    # A generator of its own, as the template's loader has: creating an iterator then draws no global RNG.
    loader = DataLoader(train_set, batch_size=batch_size, sampler=sampler, generator=torch.Generator(),
                        drop_last=spec["drop_last"])  # fmt: skip
    val_x, val_y = spec["val"][0].to(device), spec["val"][1].to(device)
    stats = spec["normalization"]  # applied on the device, as the DataModule's on_after_batch_transfer does
    view = (-1,) + (1,) * (val_x.ndim - 2)
    mean, std = torch.zeros((), device=device), torch.ones((), device=device)
    if stats:
        mean, std = (
            torch.tensor(stats[key], dtype=torch.float64, device=device).view(view).float() for key in ("mean", "std")
        )

    module, _, name = spec["net"]["class_path"].rpartition(".")
    net = getattr(importlib.import_module(module), name)(**spec["net"]["init_args"]).to(device)
    decay = [p for p in net.parameters() if p.ndim >= 2]
    no_decay = [p for p in net.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": spec["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
        lr=spec["lr"], betas=tuple(spec["betas"]),
    )  # fmt: skip
    total = len(loader) * epochs
    scheduler = WarmupCosine(optimizer, resolve_warmup_steps(spec["warmup"], total), total, spec["min_lr"])

    first_step, epoch_starts = None, []
    for epoch in range(epochs):
        epoch_starts.append(time.perf_counter())
        sampler.set_epoch(epoch)
        net.train()
        for x, y in loader:
            if first_step is None:
                first_step = time.time()
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = F.cross_entropy(net((x - mean) / std if stats else x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if spec["clip"]:
                torch.nn.utils.clip_grad_norm_(net.parameters(), spec["clip"])
            optimizer.step()
            scheduler.step()
        net.eval()
        with torch.no_grad():  # the whole val split, in batches as the DataModule serves it
            chunks = range(0, len(val_y), batch_size)
            inputs = (val_x - mean) / std if stats else val_x
            correct = sum(
                (net(inputs[i : i + batch_size]).argmax(-1) == val_y[i : i + batch_size]).sum() for i in chunks
            )
        val_acc = (correct / len(val_y)).item()  # once per epoch
    end = time.perf_counter()
    return _result("reference", workload, batch_size, len(loader), [*epoch_starts, end], first_step, t0, val_acc)


def run_template(
    config: str, workload: str, epochs: int | None = None, t0: float | None = None, save_dir: str | None = None
) -> dict:
    """The template's own `fit`, built by its CLI from the config, all its callbacks on."""
    import lightning as L

    epoch_starts: list[float] = []
    first_step: list[float] = []

    class Clock(L.Callback):
        def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            epoch_starts.append(time.perf_counter())

        def on_train_batch_start(self, *_: object) -> None:
            if not first_step:
                first_step.append(time.time())

    cli = _cli(config, workload, epochs, save_dir)
    cli.trainer.callbacks.append(Clock())
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    end = time.perf_counter()  # after the last epoch's validation and checkpoints
    val_acc = float(cli.trainer.callback_metrics["val/acc"])
    steps = int(cli.trainer.num_training_batches)
    batch_size = cli.datamodule.hparams["batch_size"]
    return _result("template", workload, batch_size, steps, [*epoch_starts, end], first_step[0], t0, val_acc)


def _result(kind: str, workload: str, batch_size: int, steps_per_epoch: int, marks: list[float],
            first_step: float | None, t0: float | None, val_acc: float) -> dict:  # fmt: skip
    epoch_ms = [1e3 * (b - a) for a, b in itertools.pairwise(marks)]
    per_step = [ms / steps_per_epoch for ms in epoch_ms[1:]]  # the first epoch is warm-up
    return {
        "kind": kind,
        "workload": workload,
        "steps_per_epoch": steps_per_epoch,
        "ms_per_step": per_step,
        "samples_per_sec": batch_size * 1e3 / statistics.median(per_step),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "val_acc": val_acc,
        "time_to_first_step_s": None if t0 is None or first_step is None else first_step - t0,
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


def checkpoint_stall(size_mb: int, saves: int = 4, interval_s: float = 1.5) -> dict:
    """How long each checkpoint save stalls the training thread: the blocking atomic writer (serialise, write,
    fsync, rename) against the background writer (a copy to host memory; the rest in a thread). The state is
    ``size_mb`` of float32 on the run's device (weights and two AdamW moments, as a checkpoint holds); between saves
    the training thread sleeps ``interval_s`` (a GPU step: the host is free), so the background write can finish."""
    from project.checkpoints import AtomicCheckpointIO, BackgroundCheckpointIO

    n = size_mb * 2**20 // 4 // 3
    state = {"state_dict": {"w": torch.randn(n, device=_device())},
             "optimizer_states": [{"exp_avg": torch.randn(n, device=_device()),
                                   "exp_avg_sq": torch.rand(n, device=_device())}]}  # fmt: skip
    result: dict[str, Any] = {"size_mb": size_mb, "saves": saves}
    with tempfile.TemporaryDirectory(dir=ROOT / "benchmarks" / "results") as scratch:
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


def _one(kind: str, config: str, workload: str, epochs: int | None, spec: Path) -> dict:
    """A run in a fresh process; its time to first step counts from the moment it was started."""
    t0 = time.time()
    out = subprocess.run(
        [sys.executable, __file__, "--one", kind, "--config", config, "--workload", workload, "--t0", repr(t0),
         "--spec", str(spec), *(["--epochs", str(epochs)] if epochs else [])],
        cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )  # fmt: skip
    if out.returncode != 0:
        raise SystemExit(f"{kind}/{workload} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--epochs", type=int, default=None, help="override each workload's epoch count")
    parser.add_argument("--config", default=CONFIG, help="the run to measure (default: configs/default.yaml)")
    parser.add_argument("--checkpoint-mb", type=int, default=240, help="checkpoint stall test size (0: skip)")
    parser.add_argument("--one", choices=["template", "reference"], help=argparse.SUPPRESS)
    parser.add_argument("--spec", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--workload", default="default", help=argparse.SUPPRESS)
    parser.add_argument("--t0", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:  # a child: one run, its result as the last line of stdout
        if args.one == "template":
            print(json.dumps(run_template(args.config, args.workload, args.epochs, args.t0)))
        else:
            print(json.dumps(run_reference(args.spec, args.workload, args.t0)))
        return

    rows, runs = [], []
    for workload in args.workloads:
        results: dict[str, list[dict]] = {"template": [], "reference": []}
        with tempfile.TemporaryDirectory() as scratch:
            spec = Path(scratch) / "spec.pt"
            write_spec(args.config, workload, args.epochs, spec)
            for _ in range(args.repeats):
                for kind in ("reference", "template"):
                    results[kind].append(_one(kind, args.config, workload, args.epochs, spec))
        runs += results["reference"] + results["template"]
        summary = {}
        for kind, rs in results.items():
            steps = [ms for r in rs for ms in r["ms_per_step"]]
            summary[kind] = {
                "median": statistics.median(steps), "min": min(steps), "max": max(steps),
                "samples_per_sec": statistics.median(r["samples_per_sec"] for r in rs),
                "peak_rss_mb": max(r["peak_rss_mb"] for r in rs),
                "val_acc": [round(r["val_acc"], 6) for r in rs],
                "first_step_s": statistics.median(r["time_to_first_step_s"] for r in rs),
            }  # fmt: skip
        ratio = summary["template"]["median"] / summary["reference"]["median"]
        rows.append({"workload": workload, "ratio": ratio, **summary, "steps_per_epoch": results["template"][0]
                     ["steps_per_epoch"], "data_path_batches_per_sec": data_path(args.config, workload)})  # fmt: skip

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU, {os.cpu_count()} cores"
    print(f"\nmake bench, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {device}, torch {torch.__version__}, "
          f"{args.repeats} runs each, alternating\n")  # fmt: skip
    header = f"{'workload':9} {'loop':9} {'ms/step median':>14} {'min':>7} {'max':>7} {'samples/s':>10} " \
             f"{'peak RSS MB':>11} {'1st step s':>10}  val acc (per run)"  # fmt: skip
    print(header)
    print("-" * len(header))
    for row in rows:
        for kind in ("reference", "template"):
            r = row[kind]
            print(f"{row['workload']:9} {kind:9} {r['median']:14.3f} {r['min']:7.3f} {r['max']:7.3f} "
                  f"{r['samples_per_sec']:10.0f} {r['peak_rss_mb']:11.0f} {r['first_step_s']:10.2f}  "
                  f"{r['val_acc']}")  # fmt: skip
        consumed = 1e3 / row["template"]["median"]
        print(f"{row['workload']:9} template/reference = {row['ratio']:.3f}x per step; data path alone "
              f"{row['data_path_batches_per_sec']:.0f} batches/s vs {consumed:.0f} consumed by training\n")  # fmt: skip
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    stall = checkpoint_stall(args.checkpoint_mb) if args.checkpoint_mb else None
    if stall:
        for name in ("atomic", "background"):
            print(
                f"checkpoint of {stall[name]['file_mb']:.0f} MB, {name:10} writer: training stalled "
                f"{statistics.median(stall[name]['stall_ms']):7.1f} ms per save (each: {stall[name]['stall_ms']})"
            )
        print(f"(the blocking writer writes {stall['atomic']['mb_per_s']:.0f} MB/s here, fsync included)\n")
    path = out / f"bench-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}.json"
    path.write_text(json.dumps({"device": device, "torch": torch.__version__, "python": platform.python_version(),
                                "rows": rows, "runs": runs, "checkpoint_stall": stall}, indent=2))  # fmt: skip
    print(f"Wrote {path}")


if __name__ == "__main__":
    main()
