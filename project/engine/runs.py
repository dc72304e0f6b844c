"""Finding runs under logs/, reading their curves back (notebooks, tests), and ``make runs``: the table of every
run (``python -m project.engine.runs [--logs logs] [--name digits]``), read from each run's provenance.json and
config.yaml only, so it answers in well under a second (no torch, no Lightning, no event files)."""

import argparse
import datetime
import importlib
import json
import os
import socket
from pathlib import Path
from typing import Any


def latest_run(logs_dir: str | Path = "logs") -> Path | None:
    """The run directory (``<logs>/<name>/version_<N>``) whose ``checkpoints/last.ckpt`` is newest, as
    `make resume` picks it; None when there is none."""
    checkpoints = sorted(Path(logs_dir).glob("*/version_*/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime)
    return checkpoints[-1].parent.parent if checkpoints else None


def read_scalars(run_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series of a run, ``{tag: [(step, value), ...]}``, read with TensorBoard's own reader (which
    also applies the purge of steps re-run after a resume)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    accumulator.Reload()
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}


def load_run(checkpoint: str | Path, read_data: bool = True) -> tuple[Any, Any]:
    """(task in eval mode on the CPU, DataModule with the run's settings and normalisation) from a checkpoint
    written by ``fit``, whatever task and DataModule it trained. With ``read_data=False`` the DataModule is rebuilt
    from what the checkpoint keeps (its learned attributes and examples) and reads none of the training data, which
    need not be on this machine. Read with ``weights_only=True``; a ``ConfigError`` in one sentence if the file is
    missing, truncated, unsafe, or not from this project's CLI."""
    from project.engine.checkpoints import load_checkpoint
    from project.engine.datamodule import DataModule
    from project.engine.errors import ConfigError, config_error_in
    from project.engine.portable import learned_in, restoring
    from project.engine.task import Task

    saved = load_checkpoint(checkpoint)
    classes = []
    for key, base, config_key in (
        ("hyper_parameters", Task, "model"),
        ("datamodule_hyper_parameters", DataModule, "data"),
    ):
        class_path = (saved.get(key) or {}).get("_class_path")
        if not class_path:
            raise ConfigError(
                f"{str(checkpoint)!r} records no {config_key}.class_path: was it written by `python -m project fit` "
                "(of this version: runs trained before tasks were chosen by model.class_path load with that code)?"
            )
        # The class the run's own config named (installed code, not code from the checkpoint). Loaded through the
        # concrete class: the base class's load_from_checkpoint would drop ``_class_path`` with the arguments it
        # does not know, and build the base.
        module, _, name = class_path.rpartition(".")
        found = getattr(importlib.import_module(module), name)
        if not issubclass(found, base):
            raise ConfigError(f"{config_key}.class_path={class_path!r} is not a {base.__module__}.{base.__name__}.")
        classes.append(found)
    task_class, data_class = classes
    try:
        with restoring(None if read_data else learned_in(saved)):
            data = data_class.load_from_checkpoint(checkpoint, weights_only=True)
    except ValueError as err:  # e.g. the data moved since training: data.root='...': no such folder
        raise (config_error_in(err) or err) from None
    model = task_class.load_from_checkpoint(checkpoint, weights_only=True, map_location="cpu").eval()
    return model, data


# Config keys that differ between runs but say nothing about the experiment.
_NOT_HYPERPARAMETERS = ("trainer.logger", "trainer.callbacks", "ckpt_path", "trainer.default_root_dir")


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"<prefix>.a.b": 1} (tuples as lists). The ``init_args`` of the task and the DataModule
    are left out of the keys, as the command line spells them: ``model.lr``, ``data.batch_size``."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if name in ("model.init_args", "data.init_args"):
            name = prefix
        if isinstance(value, dict):
            flat.update(flatten(value, name))
        else:
            flat[name] = list(value) if isinstance(value, tuple) else value
    return flat


def columns(rows: list[list[str]]) -> str:
    """Rows of cells as aligned text columns (the first row is the header)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows)


def _config_values(run_dir: Path) -> dict[str, str]:
    import yaml

    path = run_dir / "config.yaml"
    if not path.is_file():
        return {}
    flat = flatten(yaml.safe_load(path.read_text()) or {})
    return {
        key: f"{value:.4g}" if isinstance(value, float) else str(value)
        for key, value in flat.items()
        if not key.startswith(_NOT_HYPERPARAMETERS)
    }


def _seconds(start: str | None, end: str | None) -> float | None:
    if not start or not end:
        return None
    return (datetime.datetime.fromisoformat(end) - datetime.datetime.fromisoformat(start)).total_seconds()


def process_alive(pid: int | None, host: str | None = None) -> bool:
    """Whether process ``pid`` runs on this machine (False for another host's, or for no pid)."""
    if pid is None or (host is not None and host != socket.gethostname()):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_summary(run_dir: Path, logs: Path) -> dict[str, Any]:
    """One row of `make runs`: what provenance.json says about the run (or what little config.yaml says)."""
    row: dict[str, Any] = {
        "run": str(run_dir.relative_to(logs)),
        "status": "?",
        "started": "",
        "seconds": None,
        "epochs": "",
        "steps": "",
        "metric": "",
        "best": None,
        "test": None,
        "commit": "",
    }
    path = run_dir / "provenance.json"
    if not path.is_file():
        config = run_dir / "config.yaml"
        if config.is_file():
            row["started"] = (
                datetime.datetime.fromtimestamp(config.stat().st_mtime).astimezone().isoformat("T", "seconds")
            )
        row["status"] = "? (no provenance.json)"
        return row
    segments = json.loads(path.read_text())["segments"]
    last = segments[-1]
    status = last["status"]
    if status == "running" and not process_alive(last.get("pid"), last.get("machine", {}).get("host")):
        status = "killed (no end recorded)"
    if len(segments) > 1:
        status += f" (resumed {len(segments) - 1}x)"
    spent = [_seconds(s["started"], s.get("ended")) for s in segments]
    scored: dict[str, Any] = next((s for s in reversed(segments) if s.get("scores")), {})
    scores: dict[str, float] = scored.get("scores", {})
    metric = (scored.get("judged_by") or {}).get("metric", "")
    git = last.get("git") or {}
    row.update(
        status=status,
        started=segments[0]["started"],
        seconds=sum(x for x in spent if x is not None) if any(x is not None for x in spent) else None,
        epochs=last.get("epochs", ""),
        steps=last.get("steps", ""),
        metric=metric,
        best=scores.get(f"best {metric}"),
        test=scores.get(metric.replace("val/", "test/", 1)),
        commit=(git["commit"][:8] + ("*" if git.get("dirty") else "")) if git.get("commit") else "-",
    )
    return row


def find_runs(logs: Path) -> list[Path]:
    """Every run directory under ``logs`` (``<name>/version_<N>``, sweep trials ``sweeps/<name>/trial_<n>``)."""
    found = {
        p.parent
        for pattern in (
            "*/*/config.yaml",
            "*/*/provenance.json",
            "sweeps/*/*/config.yaml",
            "sweeps/*/*/provenance.json",
        )
        for p in logs.glob(pattern)
    }
    return sorted(found)


def table(logs: Path, name: str | None = None, max_hparams: int = 5) -> str:
    runs = [r for r in find_runs(logs) if name is None or str(r.relative_to(logs)).startswith(f"{name}/")]
    if not runs:
        return f"no runs under {logs}" + (f" named {name!r}" if name else "") + " (make train starts one)"
    rows = sorted((run_summary(r, logs) for r in runs), key=lambda row: row["started"])
    configs = {row["run"]: _config_values(logs / row["run"]) for row in rows}
    keys = sorted({k for c in configs.values() for k in c})
    # The recipe first (model.*: the optimizer, its lr, the schedule, LoRA), then the trainer's, the data's, the rest;
    # in each, the classes, then the keys every run has: those only some runs have come with another class (an SGD
    # run's momentum, AdamW's betas), and that class is shown.
    order = {"model": 0, "trainer": 1, "data": 2}
    rank = lambda k: 0 if k.endswith("class_path") else 1 if all(k in c for c in configs.values()) else 2  # noqa: E731
    differ = sorted(
        (k for k in keys if len({c.get(k, "") for c in configs.values()}) > 1),
        key=lambda k: (order.get(k.partition(".")[0], 3), rank(k), k),
    )
    differing, untold = differ[:max_hparams], differ[max_hparams:]
    # The scores of the metric each run is judged by: named in the header when every run shares it.
    metrics = {row["metric"] for row in rows if row["metric"]}
    shared = metrics.pop() if len(metrics) == 1 else None
    scores = [f"best {shared}", shared.replace("val/", "test/", 1)] if shared else ["judged by", "best", "test"]
    header = ["run", "status", "started", "time", "epochs", "steps", *scores, *differing, "commit"]
    lines = [header]
    for row in rows:
        seconds = row["seconds"]
        lines.append(
            [
                row["run"],
                row["status"],
                row["started"].replace("T", " ")[:16],
                "" if seconds is None else f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s",
                str(row["epochs"]),
                str(row["steps"]),
                *([] if shared else [row["metric"]]),
                "" if row["best"] is None else f"{row['best']:.4f}",
                "" if row["test"] is None else f"{row['test']:.4f}",
                *(configs[row["run"]].get(k, "") for k in differing),
                row["commit"],
            ]
        )
    named = ", ".join(untold[:3]) + (", ..." if len(untold) > 3 else "")
    more = f"\n({len(untold)} more keys differ: {named}; make runs ARGS='--columns 10' shows more)" if untold else ""
    return columns(lines) + more


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m project.engine.runs", description="The table of every run under logs/."
    )
    parser.add_argument("--logs", default="logs", help="the directory of runs (default: logs)")
    parser.add_argument("--name", default=None, help="only the runs of this experiment (logs/<name>/...)")
    parser.add_argument("--columns", type=int, default=5, help="config keys that differ shown (default: 5)")
    args = parser.parse_args(argv)
    print(table(Path(args.logs), args.name or None, args.columns))


if __name__ == "__main__":
    main()
