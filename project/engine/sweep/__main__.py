"""``python -m project.engine.sweep [configs/sweeps/default.yaml] [--workers N] [--status]`` (``make sweep``).

Checks the sweep file against the CLI, creates the study once (before any worker starts), starts ``--workers``
worker processes on the same study (each pinned to its own GPUs when there are GPUs), waits, and writes the
table, best.yaml and the plots. Run it again to continue the same study; run it on several machines (a database
``storage``) to share one.
"""

import argparse
import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

USAGE_ERROR = 2


def gpu_groups(workers: int) -> list[str | None]:
    """CUDA_VISIBLE_DEVICES for each worker: the visible GPUs split evenly (a DDP trial gets several), or shared
    round-robin when there are fewer GPUs than workers; None (unchanged) without GPUs."""
    import torch

    count = torch.cuda.device_count()
    if count == 0:
        return [None] * workers
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = visible.split(",")[:count] if visible else [str(i) for i in range(count)]
    if count < workers:
        print(f"note: {workers} workers share {count} GPU(s): each GPU runs several trials at once.")
        return [ids[i % count] for i in range(workers)]
    per = count // workers
    return [",".join(ids[i * per : (i + 1) * per]) for i in range(workers)]


def main(argv: list[str] | None = None) -> int:
    cli = argparse.ArgumentParser(prog="python -m project.engine.sweep", description=__doc__.split("\n\n")[0])
    cli.add_argument("spec", nargs="?", default="configs/sweeps/default.yaml", help="the sweep file")
    cli.add_argument("--workers", type=int, default=1, help="worker processes on the same study (default 1)")
    cli.add_argument("--status", action="store_true", help="print the table and write best.yaml/plots; run nothing")
    args = cli.parse_args(argv)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in the workers (see workers.work)
    try:
        import matplotlib  # noqa: F401
        import optuna  # noqa: F401
    except ImportError as err:
        print(
            f"error: make sweep needs {err.name}: pip install -e '.[sweep]' (make install installs it).",
            file=sys.stderr,
        )
        return USAGE_ERROR
    from project.engine.errors import ConfigError
    from project.engine.sweep import spec as sweep_spec
    from project.engine.sweep import study as sweep_study

    if args.workers < 1:
        print(f"error: --workers={args.workers}: give 1 or more (WORKERS=N).", file=sys.stderr)
        return USAGE_ERROR
    try:
        spec = sweep_spec.load(args.spec)
        cli = sweep_spec.check_against_cli(spec)
        sweep_dir = Path(cli.config.trainer.logger.init_args.save_dir) / "sweeps" / spec.name
        if args.status and not spec.storage and not (sweep_dir / "sweep.yaml").is_file():
            raise ConfigError(f"no sweep in {sweep_dir} yet: start it with make sweep SWEEP={args.spec}")
        study = sweep_study.open_study(spec, sweep_dir)[0]  # created here, once, before any worker starts
    except ConfigError as err:
        print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
        return USAGE_ERROR
    sweep_dir.mkdir(parents=True, exist_ok=True)  # on a machine of a shared study, maybe its first use here
    if args.status:
        return _report(study, spec, sweep_dir, cli)
    (sweep_dir / "sweep.yaml").write_text(sweep_spec.parser().dump(spec))
    print(f"Sweep {spec.name!r}: {spec.trials} trials, {args.workers} worker(s), in {sweep_dir}", flush=True)
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", f"{__package__}.workers", str(sweep_dir), str(i)],  # the package's own name
            env={**os.environ, **({"CUDA_VISIBLE_DEVICES": gpus} if gpus is not None else {})},
        )
        for i, gpus in enumerate(gpu_groups(args.workers))
    ]

    def stop_workers(signum: int, frame: Any) -> None:  # SIGTERM (SLURM's before a time limit, a preemption)
        for proc in processes:
            proc.send_signal(signum)  # each stops its trial (saved) and queues its values again

    signal.signal(signal.SIGTERM, stop_workers)
    codes: list[int] = []
    while len(codes) < len(processes):  # each worker reaped as it ends: a dead worker is no zombie that looks alive
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: the workers got it too; they stop their trials (saved)
            codes.append(os.waitstatus_to_exitcode(os.wait()[1]))
    _report(study, spec, sweep_dir, cli)
    if any(code == 130 for code in codes):
        print("Interrupted: run the same command again to continue the sweep.", file=sys.stderr)
        return 130
    if any(code != 0 for code in codes):
        print(f"error: worker exit codes {codes}: run the same command again to continue the sweep.", file=sys.stderr)
        return 1
    return 0


def _report(study: Any, spec: Any, sweep_dir: Path, cli: Any) -> int:
    from project.engine.sweep import report

    print(report.table(study, spec))
    best = report.write_best(study, spec, sweep_dir, cli)
    plots = report.write_plots(study, sweep_dir)
    if best:
        print(f"best config: {best}  (make train CONFIG={best})")
    if plots:
        print(f"plots: {', '.join(str(p) for p in plots)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
