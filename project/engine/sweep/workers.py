"""The study and the workers that fill it: ``python -m project.engine.sweep.workers <sweep dir> <index>``.

A worker loops: under the sweep's lock it counts the trials finished or running, stops if they make the sweep's
``trials``, otherwise asks the study for the next values and signs the trial with its host and pid. Then it runs
the trial as a normal ``python -m project fit`` in its own process (a crash, an out-of-memory or a CUDA error kills
that run, not the worker) and tells the study how it ended, read from what the trial reported.

Storage is a journal file in the sweep's directory (append-only, safe with several processes; Optuna's own advice
for one machine, faster than SQLite and without its start-up race), or a URL from the
sweep file for workers on several machines.
"""

import contextlib
import fcntl
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
from jsonargparse import Namespace
from optuna.storages import BaseStorage
from optuna.trial import TrialState

from project.engine.runs import process_alive
from project.engine.sweep.spec import build, distribution, flag, load, shown

HOST = socket.gethostname()
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)
# A trial with no pid is one whose worker died between asking and signing it (a few microseconds): after this
# long it is not a live worker's.
UNSIGNED_GRACE_S = 60
FAILURES_IN_A_ROW = 3

optuna.logging.set_verbosity(optuna.logging.WARNING)


def open_study(sweep_dir: Path, spec: Namespace, **kwargs: Any) -> tuple[optuna.Study, BaseStorage]:
    """The study and its storage. Optuna keeps a study's storage private (``study._storage``), so the one built
    here is returned for what only a storage's public API does: a trial's user attribute set from outside it."""
    if spec.storage:
        storage: BaseStorage = optuna.storages.RDBStorage(spec.storage)
    else:
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        storage = JournalStorage(JournalFileBackend(str(sweep_dir / "study.journal")))
    study = optuna.create_study(
        storage=storage, study_name=spec.name, direction=spec.direction, load_if_exists=True, **kwargs
    )
    return study, storage


def trial_id(study: optuna.Study, storage: BaseStorage, number: int) -> int:
    """The storage's id of the study's trial ``number`` (Optuna keeps a trial's own id private)."""
    return storage.get_trial_id_from_study_id_trial_number(storage.get_study_id_from_name(study.study_name), number)


@contextlib.contextmanager
def locked(sweep_dir: Path) -> Iterator[None]:
    """One worker at a time between counting the trials and asking for one, so the sweep runs exactly
    ``trials`` (an unlocked check-then-ask overshoots by up to workers - 1)."""
    with open(sweep_dir / "lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def reap(study: optuna.Study, storage: BaseStorage) -> list[int]:
    """Trials left RUNNING by a worker of this host that died (SIGKILL, out-of-memory, a lost node) are marked
    failed and their values queued again (run from scratch, under a new number). Call under ``locked``."""
    reaped = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        host, pid = trial.user_attrs.get("host"), trial.user_attrs.get("pid")
        started = trial.datetime_start.timestamp() if trial.datetime_start else time.time()
        unsigned_and_old = pid is None and time.time() - started > UNSIGNED_GRACE_S
        if (host == HOST and pid is not None and not process_alive(pid)) or unsigned_and_old:
            storage.set_trial_user_attr(trial_id(study, storage, trial.number), "error", f"its worker (pid {pid}) died")
            study.tell(trial.number, state=TrialState.FAIL)
            study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})
            reaped.append(trial.number)
    return reaped


PACKAGE = str(__package__).partition(".")[0]  # the template's top package, whatever your copy renamed it to


def trial_command(sweep_dir: Path, spec: Namespace, number: int, params: dict[str, Any]) -> list[str]:
    """The trial's ``fit``: the sweep's configs and args, its own run directory, the reporting callback, and the
    trial's values last (they win over anything before them)."""
    return [
        sys.executable, "-m", PACKAGE, "fit",
        *(a for c in spec.configs for a in ("--config", c)),
        *spec.args,
        f"--trainer.logger.init_args.save_dir={sweep_dir.parent}",
        f"--trainer.logger.init_args.name={sweep_dir.name}",
        f"--trainer.logger.init_args.version=trial_{number}",
        f"--trainer.callbacks+={__package__}.trial.SweepTrial",
        f"--trainer.callbacks.sweep_dir={sweep_dir}",
        f"--trainer.callbacks.trial={number}",
        *(flag(k, v) for k, v in params.items()),
    ]  # fmt: skip


def _die_with_parent() -> None:
    """In the trial's process, before it starts: SIGTERM when its worker dies, even by SIGKILL (Linux). The trial
    then saves last.ckpt and exits, instead of training on as an orphan that nobody reads."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class _Stop(Exception):
    """SIGTERM to the worker: stop the running trial (it saves last.ckpt), queue its values again, exit."""


def _raise_stop(signum: int, frame: Any) -> None:
    raise _Stop


def run_trial(
    study: optuna.Study, storage: BaseStorage, trial: optuna.Trial, sweep_dir: Path, spec: Namespace, worker: int
) -> TrialState:
    run_dir = sweep_dir / f"trial_{trial.number}"
    run_dir.mkdir(parents=True)  # never exists: trial numbers are not reused, a retry gets a new one
    chosen = " ".join(f"{k}={shown(v)}" for k, v in trial.params.items())
    print(f"trial {trial.number} (worker {worker}): {chosen}", flush=True)
    started, interrupted = time.monotonic(), None
    with open(run_dir / "console.log", "w") as log:
        proc = subprocess.Popen(
            trial_command(sweep_dir, spec, trial.number, trial.params),
            stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent,
        )  # fmt: skip
        while True:
            try:
                code = proc.wait()
                break
            except KeyboardInterrupt:  # Ctrl-C reached the trial too (same process group): it is saving; wait
                interrupted = "SIGINT"
            except _Stop:
                interrupted = "SIGTERM"
                proc.send_signal(signal.SIGTERM)
    took = time.monotonic() - started
    frozen = storage.get_trial(trial_id(study, storage, trial.number))  # what the trial's process reported
    values = [frozen.intermediate_values[k] for k in sorted(frozen.intermediate_values)]
    trial.set_user_attr("seconds", round(took, 1))
    trial.set_user_attr("epochs", len(values))
    if interrupted is None and code == 0 and "pruned_at_epoch" in frozen.user_attrs:
        state, result = TrialState.PRUNED, f"pruned at epoch {frozen.user_attrs['pruned_at_epoch']}"
        study.tell(trial, state=state)  # its value: the last one reported
    elif interrupted is None and code == 0 and values:
        best = max(values) if spec.direction == "maximize" else min(values)
        state, result = TrialState.COMPLETE, f"{spec.metric}={best:.4f}"
        study.tell(trial, best)
    else:
        state = TrialState.FAIL
        result = f"interrupted by {interrupted}" if interrupted else f"failed (exit {code}): {_last_line(run_dir)}"
        trial.set_user_attr("error", result)
        study.tell(trial, state=state)
        if interrupted:  # the next `make sweep` runs these values again
            study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})
    print(f"trial {trial.number} (worker {worker}): {result}  ({len(values)} validations, {took:.0f} s)", flush=True)
    if interrupted:
        raise KeyboardInterrupt
    return state


def work(sweep_dir: Path, worker: int) -> int:
    spec = load(sweep_dir / "sweep.yaml")
    sampler, pruner = build(spec, worker)
    study, storage = open_study(sweep_dir, spec, sampler=sampler, pruner=pruner)
    distributions = {key: distribution(key, param) for key, param in spec.params.items()}
    signal.signal(signal.SIGTERM, _raise_stop)
    # Ctrl-C raises KeyboardInterrupt even if SIGINT was ignored when this process started (a parent that ignores
    # it, e.g. a background job of a script or a test runner's worker): the trial stops with a checkpoint anyway.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    failures = 0
    while True:
        with locked(sweep_dir):
            counted = study.get_trials(deepcopy=False, states=(*FINISHED, TrialState.RUNNING))
            if len(counted) >= spec.trials:
                return 0
            trial = study.ask(distributions)  # values queued by a retry come first
            trial.set_user_attr("host", HOST)
            trial.set_user_attr("pid", os.getpid())
        try:
            state = run_trial(study, storage, trial, sweep_dir, spec, worker)
        except KeyboardInterrupt:
            return 130
        failures = failures + 1 if state == TrialState.FAIL else 0
        if failures >= FAILURES_IN_A_ROW:
            last = storage.get_trial(trial_id(study, storage, trial.number)).user_attrs.get("error", "")
            print(
                f"worker {worker}: {failures} trials in a row failed; stopping; the last one: {last.partition(': ')[2]}"
            )
            return 1


def _last_line(run_dir: Path) -> str:
    """The trial's last line of output: its error sentence when it failed."""
    try:
        lines = (run_dir / "console.log").read_text(errors="replace").strip().splitlines()
    except OSError as err:  # never lose the trial's record over its log
        return f"its console.log could not be read ({err.strerror})"
    return lines[-1].strip() if lines else "no output"


if __name__ == "__main__":
    sys.exit(work(Path(sys.argv[1]), int(sys.argv[2])))
