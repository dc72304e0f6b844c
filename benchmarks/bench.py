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
import math
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
# Workloads: the default config (tiny steps: Lightning's fixed per-step cost shows), and a heavier one whose step
# costs >= 10 ms on a 2-core CPU (a wider ConvNet at a larger batch).
WORKLOADS = {
    "default": {"channels": 32, "batch_size": 64, "epochs": 8},
    "heavy": {"channels": 96, "batch_size": 256, "epochs": 4},
}
SEED, LR, MIN_LR, WARMUP, WEIGHT_DECAY, CLIP, DROPOUT, SPLIT_SEED = 42, 3e-3, 1e-5, 0.05, 0.05, 1.0, 0.1, 1234


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def run_reference(workload: str, epochs: int | None = None, t0: float | None = None) -> dict:
    """The hand-written loop. Imports no Lightning: only torch, and the project's network and schedule."""
    from sklearn.datasets import load_digits
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    from project.nets import ConvNet
    from project.schedule import WarmupCosine

    w = WORKLOADS[workload]
    epochs = epochs or w["epochs"]
    device = _device()
    random.seed(SEED), np.random.seed(SEED), torch.manual_seed(SEED)  # what seed_everything(42) does
    torch.use_deterministic_algorithms(True)  # what trainer.deterministic: true does (it costs ~20% here)

    digits = load_digits()  # the DataModule's split: 15% val, 15% test, the rest train, by split_seed
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(digits.target)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(SPLIT_SEED))
    n_eval = math.ceil(len(order) * 0.15)
    val, train = order[:n_eval], order[2 * n_eval :]
    train_set = TensorDataset(images[train], labels[train])
    sampler = DistributedSampler(train_set, num_replicas=1, rank=0, shuffle=True, seed=SEED, drop_last=True)
    # A generator of its own, as the template's loader has: creating an iterator then draws no global RNG.
    loader = DataLoader(train_set, batch_size=w["batch_size"], sampler=sampler, generator=torch.Generator())
    val_x, val_y = images[val].to(device), labels[val].to(device)

    net = ConvNet((1, 8, 8), 10, channels=w["channels"], dropout=DROPOUT).to(device)
    decay = [p for p in net.parameters() if p.ndim >= 2]
    no_decay = [p for p in net.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}], lr=LR
    )
    total = len(loader) * epochs
    scheduler = WarmupCosine(optimizer, math.ceil(WARMUP * total), total, MIN_LR)

    first_step, epoch_starts = None, []
    for epoch in range(epochs):
        epoch_starts.append(time.perf_counter())
        sampler.set_epoch(epoch)
        net.train()
        for x, y in loader:
            if first_step is None:
                first_step = time.time()
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = F.cross_entropy(net(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), CLIP)
            optimizer.step()
            scheduler.step()
        net.eval()
        with torch.no_grad():  # the whole val split, in batches as the DataModule serves it
            chunks = range(0, len(val_y), 64)
            correct = sum((net(val_x[i : i + 64]).argmax(-1) == val_y[i : i + 64]).sum() for i in chunks)
        val_acc = (correct / len(val_y)).item()  # once per epoch
    end = time.perf_counter()
    return _result("reference", workload, len(loader), [*epoch_starts, end], first_step, t0, val_acc)


def run_template(
    workload: str, epochs: int | None = None, t0: float | None = None, save_dir: str | None = None
) -> dict:
    """The template's own `fit`, built by its CLI from configs/default.yaml, all default callbacks on."""
    import lightning as L

    from project.cli import CLI

    w = WORKLOADS[workload]
    epochs = epochs or w["epochs"]
    epoch_starts: list[float] = []
    first_step: list[float] = []

    class Clock(L.Callback):
        def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            epoch_starts.append(time.perf_counter())

        def on_train_batch_start(self, *_: object) -> None:
            if not first_step:
                first_step.append(time.time())

    cli = CLI(
        [
            "--config", str(ROOT / "configs" / "default.yaml"), f"--trainer.max_epochs={epochs}",
            f"--model.net.init_args.channels={w['channels']}", f"--data.batch_size={w['batch_size']}",
            f"--trainer.logger.init_args.save_dir={save_dir or ROOT / 'benchmarks' / 'results' / 'logs'}",
            "--trainer.logger.init_args.name=bench",
        ],
        run=False,
    )  # fmt: skip
    cli.trainer.callbacks.append(Clock())  # type: ignore[attr-defined]
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    end = time.perf_counter()  # after the last epoch's validation and checkpoints
    val_acc = float(cli.trainer.callback_metrics["val/acc"])
    steps = int(cli.trainer.num_training_batches)
    return _result("template", workload, steps, [*epoch_starts, end], first_step[0], t0, val_acc)


def _result(kind: str, workload: str, steps_per_epoch: int, marks: list[float], first_step: float | None,
            t0: float | None, val_acc: float) -> dict:  # fmt: skip
    epoch_ms = [1e3 * (b - a) for a, b in itertools.pairwise(marks)]
    per_step = [ms / steps_per_epoch for ms in epoch_ms[1:]]  # the first epoch is warm-up
    return {
        "kind": kind,
        "workload": workload,
        "steps_per_epoch": steps_per_epoch,
        "ms_per_step": per_step,
        "samples_per_sec": WORKLOADS[workload]["batch_size"] * 1e3 / statistics.median(per_step),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "val_acc": val_acc,
        "time_to_first_step_s": None if t0 is None or first_step is None else first_step - t0,
    }


def data_path(workload: str, epochs: int = 5) -> float:
    """Batches per second the default train DataLoader delivers on its own (nothing trains)."""
    from project.data import DigitsDataModule

    dm = DigitsDataModule(batch_size=WORKLOADS[workload]["batch_size"])
    dm.setup("fit")
    loader = dm.train_dataloader()
    start, batches = time.perf_counter(), 0
    for _ in range(epochs):
        batches += sum(1 for _ in loader)
    return batches / (time.perf_counter() - start)


def _one(kind: str, workload: str, epochs: int | None) -> dict:
    """A run in a fresh process; its time to first step counts from the moment it was started."""
    t0 = time.time()
    out = subprocess.run(
        [sys.executable, __file__, "--one", kind, "--workload", workload, "--t0", repr(t0),
         *(["--epochs", str(epochs)] if epochs else [])],
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
    parser.add_argument("--one", choices=["template", "reference"], help=argparse.SUPPRESS)
    parser.add_argument("--workload", default="default", help=argparse.SUPPRESS)
    parser.add_argument("--t0", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:  # a child: one run, its result as the last line of stdout
        run = run_template if args.one == "template" else run_reference
        print(json.dumps(run(args.workload, args.epochs, args.t0)))
        return

    rows, runs = [], []
    for workload in args.workloads:
        results: dict[str, list[dict]] = {"template": [], "reference": []}
        for _ in range(args.repeats):
            for kind in ("reference", "template"):
                results[kind].append(_one(kind, workload, args.epochs))
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
        rows.append({"workload": workload, "ratio": ratio, **summary, "data_path_batches_per_sec": data_path(workload),
                     "steps_per_epoch": results["template"][0]["steps_per_epoch"]})  # fmt: skip

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
    path = out / f"bench-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}.json"
    path.write_text(json.dumps({"device": device, "torch": torch.__version__, "python": platform.python_version(),
                                "rows": rows, "runs": runs}, indent=2))  # fmt: skip
    print(f"Wrote {path}")


if __name__ == "__main__":
    main()
