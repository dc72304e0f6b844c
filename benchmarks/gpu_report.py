"""The GPU report, the last step of ``scripts/gpu_check.sh``: what the check measured, as two tables to paste into
an issue and one JSON file (``<out>/gpu-<time>.json``).

- The template's fits over ``configs/gpu.yaml`` (fp32, bf16-mixed, bf16-mixed with a compiled net), read back
  from their run directories: step time and samples/s (medians over the logged windows after the first, which
  holds the warm-up), the time from the start of ``fit`` to the first logged step (compilation included), peak
  memory, the fraction of time spent waiting for data, and the test score.
- The bench's template against the hand-written loop on the same device, a row per workload of each
  ``bench-*.json`` in ``out`` (the check runs one in bf16-mixed and one in bf16-mixed with compile): samples/s, or
  tokens/s for a token task, of each, and their MFU (the step's FLOPs over the GPU's peak for the precision); and
  the fine-tuning row where the bench ran one.

    python benchmarks/gpu_report.py --logs logs/gpu-check --out benchmarks/results
"""

import argparse
import json
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def _median_after_warmup(values: list[float]) -> float | None:
    return statistics.median(values[1:] if len(values) > 1 else values) if values else None


def fit_row(run: Path) -> dict[str, Any]:
    """One fit of the check: its settings from config.yaml, the rest from provenance.json and its event files."""
    config = yaml.safe_load((run / "config.yaml").read_text())
    segment = json.loads((run / "provenance.json").read_text())["segments"][-1]
    events = EventAccumulator(str(run), size_guidance={"scalars": 0})
    events.Reload()
    tags = set(events.Tags()["scalars"])

    def series(tag: str) -> list[Any]:
        return events.Scalars(tag) if tag in tags else []

    batches = [e.value for e in series("train/batches_per_sec")]
    per_sec = _median_after_warmup(batches)
    first = series("train/samples_per_sec")[:1]
    started = datetime.fromisoformat(segment["started"]).timestamp()
    gpu_memory = series("train/peak_gpu_mem_mb")
    memory = gpu_memory or series("train/peak_rss_mb")
    judged = segment.get("judged_by", {}).get("metric", "val/loss").replace("val/", "test/")
    return {
        "run": str(run),
        "precision": str(config["trainer"]["precision"]),
        "compile": config["model"]["init_args"].get("compile", False),
        "step_ms": 1000 / per_sec if per_sec else None,
        "samples_per_sec": _median_after_warmup([e.value for e in series("train/samples_per_sec")]),
        "first_logged_step_s": first[0].wall_time - started if first else None,
        "first_logged_step": first[0].step + 1 if first else None,
        "peak_memory_mb": max(e.value for e in memory) if memory else None,
        "memory_kind": "GPU allocated" if gpu_memory else "process RSS",
        "data_wait": _median_after_warmup([e.value for e in series("train/data_wait")]),
        "test_metric": judged,
        "test_score": segment.get("scores", {}).get(judged),
        "machine": segment["machine"],
        "versions": segment["versions"],
    }


def _header(*columns: str) -> None:
    print(f"| {' | '.join(columns)} |\n|{'---|' * len(columns)}")


def _cell(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def report(
    logs: Path, out: Path, command: str, last: int | None = None, last_benches: int | None = None
) -> dict[str, Any]:
    runs = sorted(logs.glob("version_*"), key=lambda p: int(p.name.split("_")[1]))[-last if last else 0 :]
    if not runs:
        raise SystemExit(f"error: --logs {logs}: no run directories (version_*) to report on.")
    fits = [fit_row(run) for run in runs]
    benches = [
        json.loads(p.read_text()) for p in sorted(out.glob("bench-*.json"))[-last_benches if last_benches else 0 :]
    ]
    machine, versions = fits[0]["machine"], fits[0]["versions"]
    device = ", ".join(g["name"] for g in machine.get("gpus") or []) or f"CPU, {machine['cpus']} cores"
    now = datetime.now(timezone.utc)
    print(f"\nGPU report, {now:%Y-%m-%d %H:%M} UTC: {device}; torch {versions['torch']} (CUDA {versions['cuda']}, "
          f"cuDNN {versions['cudnn']}), Lightning {versions['lightning']}\n")  # fmt: skip
    _header("precision", "compile", "step ms", "samples/s", "first logged step s (step)", "peak memory MB",
            "data wait", "test score")  # fmt: skip
    for f in fits:
        print(f"| {f['precision']} | {f['compile']} | {_cell(f['step_ms'], '.2f')} | "
              f"{_cell(f['samples_per_sec'], '.0f')} | {_cell(f['first_logged_step_s'], '.1f')} "
              f"({f['first_logged_step']}) | {_cell(f['peak_memory_mb'], '.0f')} ({f['memory_kind']}) | "
              f"{_cell(f['data_wait'], '.1%')} | {f['test_metric']} {_cell(f['test_score'], '.4f')} |")  # fmt: skip
    if benches:
        print()
        _header("bench workload", "precision", "compile", "hand-written loop", "template", "template / loop",
                "MFU loop / template", "step ms loop / template", "first step s loop / template")  # fmt: skip
        for row in (row for b in benches for row in b["rows"]):
            ref, tpl = row["reference"], row["template"]
            if "template_tokens_per_sec" in row:
                unit, loop, mine = "tokens/s", row["reference_tokens_per_sec"], row["template_tokens_per_sec"]
            else:
                unit = "samples/s"
                loop, mine = (row["batch_size"] * 1e3 / r["step_ms"]["median"] for r in (ref, tpl))
            mfu = "-" if "template_mfu" not in row else f"{row['reference_mfu']:.1%} / {row['template_mfu']:.1%}"
            print(f"| {row['workload']} | {row['precision']} | {row['compile']} | {loop:.0f} {unit} | "
                  f"{mine:.0f} {unit} | {mine / loop:.2f}x | {mfu} | {ref['step_ms']['median']:.2f} / "
                  f"{tpl['step_ms']['median']:.2f} | {ref['first_step_s']['median']:.2f} / "
                  f"{tpl['first_step_s']['median']:.2f} |")  # fmt: skip
    finetune = next((b["finetune"] for b in benches if b.get("finetune")), None)  # the SFT row, where a bench ran it
    if finetune:
        tuned = finetune["medians"]
        print()
        _header("fine-tuning (SFT, fp32)", "assistant tokens/s", "peak memory MB", "MFU")
        for kind, m in tuned.items():
            memory = m.get("cuda_peak_mb", m["peak_rss_mb"])
            print(f"| {kind} | {m['tokens_per_sec']:.0f} | {memory:.0f} | {_cell(m.get('mfu'), '.1%')} |")
    result = {"date": f"{now:%Y-%m-%d %H:%M} UTC", "device": device, "versions": versions, "command": command,
              "fits": fits, "benches": benches}  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"gpu-{now:%Y%m%d-%H%M%S}.json"
    path.write_text(json.dumps(result, indent=2))
    print(f"\nWrote {path}. To report it, paste the tables above into an issue, with the command: {command}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logs", required=True, help="the check's run directories: <logs>/version_*")
    parser.add_argument("--out", required=True, help="where the bench wrote bench-*.json; gpu-*.json goes there too")
    parser.add_argument("--command", default="scripts/gpu_check.sh", help="the command to name in the report")
    parser.add_argument("--last", type=int, default=None, help="only the newest N runs (this check's own)")
    parser.add_argument("--last-benches", type=int, default=None, help="only the newest N bench-*.json (the check's)")
    args = parser.parse_args()
    report(Path(args.logs), Path(args.out), args.command, args.last, args.last_benches)


if __name__ == "__main__":
    sys.exit(main())
