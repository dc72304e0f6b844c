"""How a command ends: bad input is one sentence and exit 2; a fault (a full disk, a killed loader worker, a run that
diverged) one sentence naming what was kept and how to continue, exit 1; a signal the resume command, exit 128 + the
signal; anything else its traceback."""

import re
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.spike import TrainingSpikeException
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from project.engine.checkpointing.checkpoint_io import DISK_FULL, CheckpointWriteError, free_space
from project.engine.checkpointing.last_checkpoint import Interrupted, LoaderWorkerDied
from project.engine.errors import ConfigError, cause_of
from project.engine.observe.divergence import Diverged

PACKAGE = str(__package__).partition(".")[0]  # the top package (a renamed copy names its own)
# The directory of the run being fitted, once it has one (the CLI sets it): for the message on a full disk.
run_dir: Path | None = None


def _resume_command() -> str:
    """The command that continues the run being fitted (or, before one has a directory, the latest run)."""
    return f"make resume RUN={run_dir}" if run_dir else "make resume"


def disk_fault(err: OSError) -> str | None:
    """One sentence for a failed write: the checkpoint's own (it names the file), else that of another writer on
    the same full disk (the logger's event file, found first or raised while the run shut down); None for any
    other OSError."""
    checkpoint = cause_of(err, CheckpointWriteError)
    if checkpoint is not None:
        return str(checkpoint.strerror)
    if err.errno not in DISK_FULL:
        return None
    where = f"{run_dir} ({free_space(run_dir)})" if run_dir else "the run directory"
    return (
        f"no space left on the device writing to {where}; the checkpoints already written are untouched. Free "
        f"some space, then continue the run: {_resume_command()}"
    )


# torch's two ways of saying a loader worker died: its SIGCHLD handler's, and the loader's when a fetch times out.
_DEAD_WORKER = re.compile(r"DataLoader worker \(pids?(?:\(s\))? ([\d, ]+)\) (?:is killed by signal: ([^.]+)|exited)")


def worker_fault(err: RuntimeError) -> str | None:
    """One sentence for a DataLoader worker killed under the run (the out-of-memory killer, most often); None for
    any other RuntimeError."""
    match = _DEAD_WORKER.search(str(err))
    if match is None:
        return None
    pids, signal_name = match.groups()
    how = f"was killed by a signal ({signal_name})" if signal_name else "exited unexpectedly"
    kept = (
        f"The run stopped after step {err.step} with {err.checkpoint} saved"
        if isinstance(err, LoaderWorkerDied)
        else "The checkpoints already written are whole"
    )
    return (
        f"a DataLoader worker (pid {pids.strip()}) {how}: most often the out-of-memory killer (dmesg names "
        "it); fewer data.num_workers, a smaller data.prefetch_factor or data.batch_size, or smaller samples "
        f"need less memory. {kept}; continue it: {_resume_command()}"
    )


def _quiet_about_a_full_disk(args: threading.ExceptHookArgs) -> None:
    """A writer thread's full-disk error is raised again on the main thread, which reports it in one sentence."""
    if not (isinstance(args.exc_value, OSError) and args.exc_value.errno in DISK_FULL):
        threading.__excepthook__(args)


def run_with_exit_codes(command: Callable[[], Any]) -> None:
    """Runs ``command`` (the CLI), ending the process as the module docstring says."""
    threading.excepthook = _quiet_about_a_full_disk
    try:
        command()
    except (ConfigError, MisconfigurationException) as err:
        message = str(err)
        if "Original Traceback" in message:  # raised in a DataLoader worker: torch prepends the worker's traceback
            message = message.rstrip().splitlines()[-1].partition(": ")[2]
        print(f"error: {' '.join(message.split())}", file=sys.stderr)  # Lightning's own misconfigurations too
        sys.exit(2)
    except OSError as err:  # a fault, not bad input: the run stops, what was written whole is kept
        fault = disk_fault(err)
        if fault is None:
            raise
        print(f"error: {fault}", file=sys.stderr)
        sys.exit(1)
    except Diverged as stop:  # every process stops at the same step; the first says why
        if stop.rank == 0:
            print(f"error: {stop}", file=sys.stderr)
        sys.exit(1)
    except AttributeError as err:  # Lightning's LearningRateFinder callback, listed: it looks for task.lr (#16787)
        if "When using the learning rate finder" not in str(err):
            raise
        print(
            "error: Lightning's LearningRateFinder callback sets a learning rate attribute of the task (lr or "
            "learning_rate), and this task's learning rate is its optimizer's (model.optimizer.init_args.lr): take the "
            "callback out of trainer.callbacks and run the range test as a command instead: make lr-find.",
            file=sys.stderr,
        )
        sys.exit(2)
    except TrainingSpikeException as spike:  # Lightning's SpikeDetection, if a user lists it
        print(
            f"error: the run stopped on a loss spike (Lightning's SpikeDetection: {spike}, counted within its epoch); "
            "the checkpoints already written are untouched. Lower the learning rate or warm up longer, or let the "
            "DivergenceGuard callback skip non-finite steps (action: skip).",
            file=sys.stderr,
        )
        sys.exit(1)
    except RuntimeError as err:  # a fault: a loader worker killed (LastCheckpoint stopped the run, or the loader)
        fault = worker_fault(err)
        if fault is None and not isinstance(err, LoaderWorkerDied):
            raise
        if fault is not None:  # None: it was another process's worker, which says so
            print(f"error: {fault}", file=sys.stderr)
        sys.exit(1)
    except Interrupted as stop:
        if stop.rank == 0:
            run = stop.checkpoint.parent.parent
            print(
                f"Interrupted by {stop}. Resume with: make resume RUN={run}  (or: python -m {PACKAGE} fit "
                f"--config {run}/config.yaml --ckpt_path {stop.checkpoint})",
                file=sys.stderr,
            )
        sys.exit(128 + stop.signum)
    finally:
        # A DDP rank leaves its process group before the interpreter exits, however its run ended (finished, or
        # stopped by a signal at the step every rank stops at): left to interpreter shutdown, gloo's and the
        # rendezvous store's C++ threads are torn down after the peer that hosts the store may have gone, which
        # can abort the rank (exit 134: a failed job to SLURM and torchrun; seen after a SIGTERM too).
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
