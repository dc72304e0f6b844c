"""A worker: ``python -m project.engine.sweep.workers <sweep dir> <index>``, Optuna's ``study.optimize`` loop.

Before each trial, under the sweep's lock, the worker fails the trials whose worker is gone (their values queued
again), counts the finished and running ones, and asks for the next values only if they do not make ``trials``
yet; if they do while others still run on other machines, it waits: one of those may yet be lost. The objective
runs the trial as a normal ``python -m project fit`` in its own process (a crash, an out-of-memory or a CUDA
error kills that run, not the worker) and returns what the trial reported.
"""

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from project.engine.sweep.spec import base_args, build, distributions, flag, load, shown, suggest
from project.engine.sweep.study import HOST, fail_stale, lock, open_study, retry, trial_id

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)
FAILURES_IN_A_ROW = 3
PACKAGE = str(__package__).partition(".")[0]  # the template's top package, whatever your copy renamed it to


class TrialFailed(Exception):
    """The trial's run ended without a result: Optuna marks the trial failed and the worker goes on."""


class Stop(KeyboardInterrupt):
    """SIGTERM to the worker: its trial is stopped (it saves last.ckpt) and queued again, as by Ctrl-C."""


def _raise_stop(signum: int, frame: Any) -> None:
    raise Stop


def _die_with_parent() -> None:
    """In the trial's process, before it starts: SIGTERM when its worker dies, even by SIGKILL (Linux). The trial
    then saves last.ckpt and exits, instead of training on as an orphan that nobody reads."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def trial_command(sweep_dir: Path, spec: Any, number: int, params: dict[str, Any]) -> list[str]:
    """The trial's ``fit``: the sweep's configs and args, its own run directory, the reporting callback, and the
    trial's values last (they win over anything before them)."""
    run_dir = {"save_dir": sweep_dir.parent, "name": sweep_dir.name, "version": f"trial_{number}"}
    return [
        *(sys.executable, "-m", PACKAGE, "fit", *base_args(spec)),
        *(f"--trainer.logger.init_args.{key}={value}" for key, value in run_dir.items()),
        *(f"--trainer.callbacks+={__package__}.trial.SweepTrial", f"--trainer.callbacks.sweep_dir={sweep_dir}"),
        f"--trainer.callbacks.trial={number}",
        *(flag(k, v) for k, v in params.items()),
    ]


class Worker:
    def __init__(self, sweep_dir: Path, index: int) -> None:
        self.sweep_dir, self.index, self.spec = sweep_dir, index, load(sweep_dir / "sweep.yaml")
        self.study, self.store = open_study(self.spec, sweep_dir, pruner=build(self.spec)[1])
        self.distributions = distributions(self.spec)
        self.held = contextlib.ExitStack()  # the lock, from the count until the trial it allows is asked
        self.failures = 0

    def claim(self) -> bool:
        """Whether to run another trial; if so, the lock is held until ``objective`` has its trial."""
        waiting = False
        while True:
            self.held.enter_context(lock(self.study, self.store, self.sweep_dir))
            fail_stale(self.study, self.store, self.spec.max_retry)
            trials = self.study.get_trials(deepcopy=False)
            finished, running = (sum(t.state in states for t in trials) for states in (FINISHED, (TrialState.RUNNING,)))
            if finished + running < self.spec.trials:
                # Seeded by the trials before it (counted under the lock): no two proposals alike, on any machine.
                self.study.sampler = build(self.spec, offset=len(trials))[0]
                return True
            self.held.close()
            # With a database, a trial running on another machine may yet be lost and need running again: wait
            # for it. On one machine the others are this sweep's own workers (a dead one's trial is failed here).
            if finished >= self.spec.trials or not self.spec.storage:
                return False
            if not waiting:
                print(
                    f"worker {self.index}: the sweep has its trials but {running} still running elsewhere, which "
                    "may need running again: waiting for them.",
                    flush=True,
                )
            waiting = True
            time.sleep(self.spec.heartbeat_interval)

    def after(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        """Optuna's callback after each trial: stop after failures in a row, or when the sweep has its trials."""
        self.failures = self.failures + 1 if trial.state == TrialState.FAIL else 0
        if self.failures >= FAILURES_IN_A_ROW:
            print(
                f"worker {self.index}: {self.failures} trials in a row failed; stopping; the last one: "
                f"{trial.user_attrs['error'].partition(': ')[2]}",
                flush=True,
            )
            study.stop()
        elif not self.claim():
            study.stop()

    def objective(self, trial: optuna.Trial) -> float:
        trial.set_user_attr("host", HOST)
        trial.set_user_attr("pid", os.getpid())
        trial.set_user_attr("error", "")  # a retry copies its original's attributes
        self.held.close()  # signed: the next worker may count
        for key, dist in self.distributions.items():
            suggest(trial, key, dist)
        run_dir = self.sweep_dir / f"trial_{trial.number}"
        run_dir.mkdir(parents=True)  # never exists: trial numbers are not reused, a retry gets a new one
        chosen = " ".join(f"{k}={shown(v)}" for k, v in trial.params.items())
        print(f"trial {trial.number} (worker {self.index}): {chosen}", flush=True)
        started, interrupted = time.monotonic(), None
        with open(run_dir / "console.log", "w") as log:
            command = trial_command(self.sweep_dir, self.spec, trial.number, trial.params)
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
            while True:
                try:
                    code = proc.wait()
                    break
                except Stop:
                    interrupted = "SIGTERM"
                    proc.send_signal(signal.SIGTERM)
                except KeyboardInterrupt:  # Ctrl-C reached the trial too (same process group): it is saving; wait
                    interrupted = "SIGINT"
        took = time.monotonic() - started
        reported = self.store.get_trial(trial_id(self.study, self.store, trial.number))  # by the trial's process
        values = [reported.intermediate_values[k] for k in sorted(reported.intermediate_values)]
        trial.set_user_attr("seconds", round(took, 1))
        trial.set_user_attr("epochs", len(values))
        done = f"({len(values)} validations, {took:.0f} s)"
        if interrupted is None and code == 0 and "pruned_at_epoch" in reported.user_attrs:
            print(
                f"trial {trial.number} (worker {self.index}): pruned at epoch "
                f"{reported.user_attrs['pruned_at_epoch']}  {done}",
                flush=True,
            )
            raise optuna.TrialPruned  # its value: the last one reported
        if interrupted is None and code == 0 and values:
            best = max(values) if self.spec.direction == "maximize" else min(values)
            print(f"trial {trial.number} (worker {self.index}): {self.spec.metric}={best:.4f}  {done}", flush=True)
            return best
        error = f"interrupted by {interrupted}" if interrupted else f"failed (exit {code}): {_last_line(run_dir)}"
        trial.set_user_attr("error", error)
        print(f"trial {trial.number} (worker {self.index}): {error}  {done}", flush=True)
        if interrupted:  # Optuna marks it failed; the next `make sweep` runs its values again
            retry(self.study, self.store, trial.number)
            raise KeyboardInterrupt
        raise TrialFailed(error)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, _raise_stop)
        # Ctrl-C raises KeyboardInterrupt even if SIGINT was ignored when this process started (a parent that
        # ignores it, e.g. a background job of a script or a test runner's worker): the trial stops with a
        # checkpoint anyway.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            if self.claim():
                self.study.optimize(self.objective, catch=(TrialFailed,), callbacks=[self.after])
        except KeyboardInterrupt:
            return 130
        finally:
            self.held.close()
        return 1 if self.failures >= FAILURES_IN_A_ROW else 0


def _last_line(run_dir: Path) -> str:
    """The trial's last line of output: its error sentence when it failed."""
    try:
        lines = (run_dir / "console.log").read_text(errors="replace").strip().splitlines()
    except OSError as err:  # never lose the trial's record over its log
        return f"its console.log could not be read ({err.strerror})"
    return lines[-1].strip() if lines else "no output"


if __name__ == "__main__":
    sys.exit(Worker(Path(sys.argv[1]), int(sys.argv[2])).run())
