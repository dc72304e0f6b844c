"""``<run>/provenance.json``: what produced a run, so a result from last month can be reproduced with confidence.

One segment per ``fit`` of the run (a resumed run shows one more segment each time): the command line, the
working directory, start and end times, how it ended (finished, stopped early, interrupted by a signal, crashed
with the exception's one line), the project's git commit and whether the tree was dirty (then ``git-<k>.patch``,
the uncommitted diff with the untracked source and config files, which ``git apply`` reproduces on that commit;
never a file whose name looks like a secret: ``git_snapshot.py``), Python and library
versions, the accelerators, world size and host, and ``pip-freeze-<k>.txt`` (written when the installed packages
differ from the previous segment's). Written by rank 0, atomically, plain JSON; also shown in TensorBoard's text
tab. ``make runs`` reads it.
"""

import datetime
import importlib.metadata
import json
import os
import platform
import re
import shlex
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_warn

from project.engine.checkpointing.last_checkpoint import Interrupted, LoaderWorkerDied
from project.engine.hooks import defined_hooks_only
from project.engine.observe.config_keys import flatten
from project.engine.observe.divergence import Diverged
from project.engine.observe.git_snapshot import git_state

PROJECT_ROOT = Path(__file__).resolve().parents[3]  # the checkout whose code ran (not the working directory)


def now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def installed_packages() -> str:
    """``pip freeze``'s content (name==version, names normalized as pip compares them, sorted) without starting pip:
    read from the names of the ``<name>-<version>.dist-info`` folders on ``sys.path``, as an import finds them (the
    first wins). Reading every package's metadata instead costs ~0.5 s per run, seconds on a cold disk."""
    found: dict[str, str] = {}
    for folder in (entry or "." for entry in sys.path):
        try:
            names = sorted(os.listdir(folder))
        except OSError:  # a zip file or a missing folder on the path
            continue
        for name in names:
            if name.endswith(".dist-info"):
                project, _, version = name.removesuffix(".dist-info").partition("-")
            elif name.endswith(".egg-info") and os.path.isdir(os.path.join(folder, name)):  # a legacy install
                legacy = importlib.metadata.PathDistribution(Path(folder, name))
                project, version = legacy.metadata["Name"] or "", legacy.version
            else:
                continue
            found.setdefault(re.sub(r"[-_.]+", "-", project).lower(), version)
    return "".join(f"{project}=={version}\n" for project, version in sorted(found.items()) if project)


def versions() -> dict[str, Any]:
    import lightning
    import torchmetrics

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "lightning": lightning.__version__,
        "torchmetrics": torchmetrics.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
    }


def machine(trainer: L.Trainer) -> dict[str, Any]:
    gpus = []
    for i in range(torch.cuda.device_count()):
        memory_gb = round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1)
        gpus.append({"name": torch.cuda.get_device_name(i), "memory_gb": memory_gb})
    return {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "accelerator": type(trainer.accelerator).__name__.replace("Accelerator", "").lower(),
        "gpus": gpus,
        "world_size": trainer.world_size,
        "num_nodes": trainer.num_nodes,
        "precision": str(trainer.precision),
    }


def ending(trainer: L.Trainer, exception: BaseException | None = None) -> str:
    """How the segment ended, in a few words."""
    if isinstance(exception, Interrupted):
        return f"interrupted by {signal.Signals(exception.signum).name} at step {exception.step}"
    if isinstance(exception, LoaderWorkerDied):
        return f"stopped at step {exception.step}: a DataLoader worker died"
    if isinstance(exception, Diverged):
        return f"diverged: {exception.found}"
    if isinstance(exception, KeyboardInterrupt):
        return "interrupted (KeyboardInterrupt, no checkpoint)"
    if exception is not None:
        first = (str(exception).strip().splitlines() or [""])[0][:300]
        return f"crashed: {type(exception).__name__}: {first}".rstrip(": ")
    for stopper in trainer.early_stopping_callbacks:
        if stopper.stopped_epoch:
            return f"stopped early at epoch {stopper.stopped_epoch}"
    callbacks = trainer.callbacks  # type: ignore[attr-defined]
    pruned = next((cb.pruned_at for cb in callbacks if getattr(cb, "pruned_at", None) is not None), None)
    if pruned is not None:
        return f"pruned at epoch {pruned}"
    return "finished"


@defined_hooks_only
class Provenance(Callback):
    """Writes the run's provenance.json (see the module's docstring); listed in configs/default.yaml's callbacks."""

    def __init__(self, cli_args: list[str] | None = None) -> None:
        """``cli_args``: what the CLI parsed, recorded beside the process's command line (they differ in a notebook)."""
        self.cli_args = cli_args
        self.path: Path | None = None
        self.record: dict[str, Any] = {}

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit" or getattr(trainer, "fast_dev_run", False):
            return
        log_dir = trainer.log_dir  # a broadcast from rank 0: every rank must ask
        if not trainer.is_global_zero:
            return
        run_dir = Path(log_dir or trainer.default_root_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run_dir / "provenance.json"
        self.record = json.loads(self.path.read_text()) if self.path.is_file() else {"segments": []}
        segments = self.record["segments"]
        k = len(segments)
        packages = installed_packages()
        previous = next((s["pip_freeze"] for s in reversed(segments) if s.get("pip_freeze")), None)
        if previous is None or (run_dir / previous).read_text() != packages:
            (run_dir / f"pip-freeze-{k}.txt").write_text(packages)
            previous = f"pip-freeze-{k}.txt"
        segments.append(
            {
                "segment": k,
                "command": shlex.join(sys.orig_argv),  # as typed: python -m project fit ...
                "cli_args": self.cli_args,
                "cwd": os.getcwd(),
                "started": now(),
                "ended": None,
                "status": "running",
                "pid": os.getpid(),
                "resumed_from": None,  # known once Lightning has restored the checkpoint: on_fit_start
                "git": git_state(PROJECT_ROOT, run_dir / f"git-{k}.patch"),
                "versions": versions(),
                "machine": machine(trainer),
                "pip_freeze": previous,
            }
        )
        self._write()
        self._show(trainer)

    def update(self, **fields: Any) -> None:
        """Add fields (e.g. the final scores) to this segment's record."""
        if self.path is not None:
            self.record["segments"][-1].update(fields)
            self._write()

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.ckpt_path:
            self.update(resumed_from=str(trainer.ckpt_path))

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # After the task's on_fit_start, which loads a fresh run's starting weights (model.init_from, a backbone's).
        if getattr(pl_module, "initialized_from", None):
            self.update(initialized_from=pl_module.initialized_from)  # type: ignore[arg-type]

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._end(trainer, None)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._end(trainer, exception)

    def _end(self, trainer: L.Trainer, exception: BaseException | None) -> None:
        # Not twice, nor for a refused run, whose directory SaveConfig removed.
        if self.path is None or self.record["segments"][-1]["ended"] is not None or not self.path.parent.is_dir():
            return
        self.update(
            ended=now(), status=ending(trainer, exception), epochs=trainer.current_epoch, steps=trainer.global_step
        )
        self._show(trainer)

    def _write(self) -> None:
        assert self.path is not None
        try:
            write_json(self.path, self.record)
        except OSError as err:  # e.g. a full disk: the record is not worth hiding the run's own error for
            rank_zero_warn(f"could not write {self.path} ({err.strerror or err}); the run's record is incomplete.")

    def _show(self, trainer: L.Trainer) -> None:
        """The segment as a markdown table in TensorBoard's text tab (provenance, one entry per start and end)."""
        if not isinstance(trainer.logger, TensorBoardLogger):
            return
        segment = self.record["segments"][-1]
        rows = ["| | |", "|---|---|", *(f"| {key} | `{value}` |" for key, value in flatten(segment).items())]
        trainer.logger.experiment.add_text(
            f"provenance/segment_{segment['segment']}", "\n".join(rows), trainer.global_step
        )
        trainer.logger.experiment.flush()


def write_json(path: Path, record: Any) -> None:
    """``record`` as JSON at ``path``, atomically: written beside it, then renamed over it, so a reader (or a
    process killed mid-write) never sees half a file. A failed write leaves no temporary file and raises."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(json.dumps(record, indent=2) + "\n")
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
