"""``make runs``: the table of every run (``python -m project.engine.observe.runs [--logs logs] [--name digits]``), read
from each run's provenance.json and config.yaml only, so it answers in well under a second (no torch, no Lightning,
no event files)."""

import argparse
import datetime
import json
import os
import socket
from pathlib import Path
from typing import Any

from project.engine.observe.config_keys import flatten

# Config keys that differ between runs but say nothing about the experiment.
_NOT_HYPERPARAMETERS = ("trainer.logger", "trainer.callbacks", "ckpt_path", "trainer.default_root_dir")


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
        prog="python -m project.engine.observe.runs", description="The table of every run under logs/."
    )
    parser.add_argument("--logs", default="logs", help="the directory of runs (default: logs)")
    parser.add_argument("--name", default=None, help="only the runs of this experiment (logs/<name>/...)")
    parser.add_argument("--columns", type=int, default=5, help="config keys that differ shown (default: 5)")
    args = parser.parse_args(argv)
    print(table(Path(args.logs), args.name or None, args.columns))


if __name__ == "__main__":
    main()
