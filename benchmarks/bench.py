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

    python benchmarks/bench.py [--repeats 3] [--workloads default long] [--checkpoint-mb 240]
"""

import argparse
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

import project  # noqa: F401  (before Lightning, which imports torchvision: see project/__init__.py)

ROOT = Path(__file__).resolve().parents[1]
CONFIG = str(ROOT / "configs" / "default.yaml")
# Workloads: flags over the config. "default" is the config as it is (the shipped one has tiny steps, 20 per epoch:
# Lightning's fixed per-step and per-epoch costs show); "long" has >= 200 steps per epoch and a step of >= 20 ms on
# a 2-core CPU for the shipped ConvNet (6x wider, batch 6), as a real epoch has. Both runs of a workload read
# everything from the template's own objects (write_spec), so they do the same work whatever the data and net.
WORKLOADS = {
    "default": {"args": [], "epochs": 8},
    "long": {"args": ["--model.net.init_args.channels=192", "--data.batch_size=6"], "epochs": 3},
}


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _cli(config: str, workload: str, epochs: int | None, save_dir: str | None = None) -> Any:
    from project.engine.cli import CLI

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
    dm, model, trainer = cli.datamodule, cli.config.model.init_args, cli.config.trainer
    dm.setup("fit")
    task = type(cli.model).__name__
    if task not in RECIPES:
        raise SystemExit(f"error: the hand-written loop knows the tasks {sorted(RECIPES)}, not {task}.")
    net_args = {**model.net.init_args.as_dict(), "input_shape": list(dm.input_shape), "num_outputs": dm.num_outputs}
    spec = {
        "task": task, "monitor": cli.model.monitor,
        "train": dm.split_tensors("train"), "val": dm.split_tensors("val"), "normalization": dm.normalization,
        "net": {"class_path": model.net.class_path, "init_args": net_args},
        "lr": model.lr, "min_lr": model.min_lr, "warmup": model.warmup, "weight_decay": model.weight_decay,
        "betas": list(model.betas), "clip": trainer.gradient_clip_val, "deterministic": trainer.deterministic,
        "batch_size": dm.hparams["batch_size"], "drop_last": dm.hparams["drop_last"],
        "seed": cli.config.seed_everything, "epochs": epochs or WORKLOADS[workload]["epochs"],
    }  # fmt: skip
    torch.save(spec, path)


def run_reference(spec_path: str | Path, workload: str = "default", t0: float | None = None) -> dict:
    """The hand-written loop. Imports no Lightning: only torch, and the project's network and schedule; the task's
    loss and metric are written out by hand (``RECIPES``)."""
    imported = time.time()
    import importlib

    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    from project.engine.schedule import WarmupCosine, resolve_warmup_steps

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
    loss_of, score_of = RECIPES[spec["task"]](spec["train"][1].to(device))
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

    marks: dict[str, Any] = {"t0": t0, "imported": imported, "epoch_start": [], "train_end": [], "val": []}
    for epoch in range(epochs):
        marks["epoch_start"].append(time.time())
        sampler.set_epoch(epoch)
        net.train()
        for x, y in loader:
            if "first_batch" not in marks:
                marks["first_batch"] = time.time()
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = loss_of(net((x - mean) / std if stats else x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if spec["clip"]:
                torch.nn.utils.clip_grad_norm_(net.parameters(), spec["clip"])
            optimizer.step()
            scheduler.step()
            if "first_step_end" not in marks:
                marks["first_step_end"] = time.time()
        marks["train_end"].append(time.time())
        val_start = time.time()
        net.eval()
        with torch.no_grad():  # the whole val split, in batches as the DataModule serves it
            chunks = range(0, len(val_y), batch_size)
            inputs = (val_x - mean) / std if stats else val_x
            outputs = torch.cat([net(inputs[i : i + batch_size]) for i in chunks])
        val_metric = score_of(outputs, val_y).item()  # once per epoch
        marks["val"].append(time.time() - val_start)
    marks["end"] = time.time()
    return _result("reference", workload, batch_size, len(loader), marks, val_metric)


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


# The tasks the hand-written loop can replay: (loss(outputs, targets), the judged metric(outputs, targets)).
RECIPES = {"Classifier": _classifier, "Regressor": _regressor}


def run_template(
    config: str, workload: str, epochs: int | None = None, t0: float | None = None, save_dir: str | None = None
) -> dict:
    """The template's own `fit`, built by its CLI from the config, all its callbacks on."""
    marks: dict[str, Any] = {"t0": t0, "epoch_start": [], "train_end": [], "val": [], "saves": []}
    import lightning as L

    from project.engine.cli import CLI  # noqa: F401  (imported here so the import time is counted as imports)

    marks["imported"] = time.time()

    class Clock(L.Callback):
        def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
            marks.setdefault("setup", time.time())

        def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            marks["epoch_start"].append(time.time())

        def on_train_batch_start(self, *_: object) -> None:
            marks.setdefault("first_batch", time.time())

        def on_train_batch_end(self, *_: object) -> None:
            marks.setdefault("first_step_end", time.time())
            self.last_batch_end = time.time()

        def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            if not trainer.sanity_checking:
                marks["train_end"].append(self.last_batch_end)
                self.val_start = time.time()

        def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            if not trainer.sanity_checking:
                marks["val"].append(time.time() - self.val_start)

        def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            marks["end"] = time.time()

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
    cli.trainer.callbacks.append(Clock())
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    val_metric = float(cli.trainer.callback_metrics[cli.model.monitor])
    steps = int(cli.trainer.num_training_batches)
    batch_size = cli.datamodule.hparams["batch_size"]
    return _result("template", workload, batch_size, steps, marks, val_metric)


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
        if kind == "template":
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
    from project.engine.checkpoints import AtomicCheckpointIO, BackgroundCheckpointIO

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


def _one(kind: str, config: str, workload: str, epochs: int | None, spec: Path, results: str) -> dict:
    """A run in a fresh process; its time to first step counts from the moment it was started."""
    t0 = time.time()
    out = subprocess.run(
        [sys.executable, __file__, "--one", kind, "--config", config, "--workload", workload, "--t0", repr(t0),
         "--spec", str(spec), "--out", results, *(["--epochs", str(epochs)] if epochs else [])],
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
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"), help="where the JSON report goes")
    parser.add_argument("--one", choices=["template", "reference"], help=argparse.SUPPRESS)
    parser.add_argument("--spec", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--workload", default="default", help=argparse.SUPPRESS)
    parser.add_argument("--t0", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:  # a child: one run, its result as the last line of stdout
        if args.one == "template":
            print(json.dumps(run_template(args.config, args.workload, args.epochs, args.t0, f"{args.out}/logs")))
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
                    results[kind].append(_one(kind, args.config, workload, args.epochs, spec, args.out))
        runs += results["reference"] + results["template"]
        summary = {kind: _summarise(rs) for kind, rs in results.items()}
        ref, tpl = summary["reference"], summary["template"]
        rows.append({
            "workload": workload, **summary, "steps_per_epoch": results["template"][0]["steps_per_epoch"],
            "step_overhead_ms": tpl["step_ms"]["median"] - ref["step_ms"]["median"],
            "step_overhead_pct": 100 * (tpl["step_ms"]["median"] / ref["step_ms"]["median"] - 1),
            "epoch_overhead_ms": tpl["epoch_fixed_ms"]["median"] - ref["epoch_fixed_ms"]["median"],
            "whole_run_ratio": tpl["whole_run_s"]["median"] / ref["whole_run_s"]["median"],
            "training_ratio": (tpl["whole_run_s"]["median"] - tpl["first_step_s"]["median"])
            / (ref["whole_run_s"]["median"] - ref["first_step_s"]["median"]),
            "noise_pct": ref["step_ms"]["spread_pct"],
            "data_path_batches_per_sec": data_path(args.config, workload),
        })  # fmt: skip

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU, {os.cpu_count()} cores"
    print(f"\nmake bench, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {device}, torch {torch.__version__}, "
          f"{args.repeats} runs each, alternating; medians [min-max] over runs\n")  # fmt: skip
    for row in rows:
        ref, tpl = row["reference"], row["template"]
        print(f"{row['workload']}: {row['steps_per_epoch']} steps per epoch")
        for kind, r in (("reference", ref), ("template", tpl)):
            up = r["startup"]
            print(
                f"  {kind:9}  step {_mmm(r['step_ms'], 2)} ms   per epoch {_mmm(r['epoch_fixed_ms'], 1)} ms "
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
              f"{row['whole_run_ratio']:.2f}x (after the first step: {row['training_ratio']:.2f}x); noise: the "
              f"reference's run-to-run spread {row['noise_pct']:.1f}%; data path alone "
              f"{row['data_path_batches_per_sec']:.0f} batches/s\n")  # fmt: skip
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
    path = out / f"bench-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}.json"
    path.write_text(json.dumps({"device": device, "torch": torch.__version__, "python": platform.python_version(),
                                "rows": rows, "runs": runs, "checkpoint_stall": stall}, indent=2))  # fmt: skip
    print(f"Wrote {path}")


if __name__ == "__main__":
    main()
