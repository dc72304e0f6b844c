"""Processes of ``python -m project`` that start from an interpreter which has already imported torch, Lightning and
the package: multiprocessing's fork server, started once per test process with those modules preloaded, forks each
one. A fresh interpreter spends ~5 s of CPU importing them (``import lightning.pytorch`` alone ~4.5 s), which is
most of what a short run costs.

``start`` is one such process, with the ``subprocess.Popen`` methods a test uses on it (``pid``, ``poll``, ``wait``):
it may be signalled, stopped or killed like one, its process group with it (it leads a session of its own, as
``start_new_session`` gives). ``ranks`` runs a DDP job as torchrun would: one forked process per rank with
``LOCAL_RANK``, ``NODE_RANK`` and ``WORLD_SIZE`` set, so Lightning launches nothing itself: its
``LightningEnvironment`` sees processes created outside it.

Not for what only a fresh interpreter shows: Lightning's own launcher of the ranks (it starts ``sys.executable``
again), what a run imports, or a warning raised while importing. Those tests start ``python -m project`` itself.
"""

import multiprocessing
import os
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

PRELOAD = ["torch", "lightning.pytorch", "project.engine.run.cli", "probes"]
_context = multiprocessing.get_context("forkserver")
_context.set_forkserver_preload(PRELOAD)


def _main(args: Sequence[str], env: dict[str, str], cwd: str, stdout: str, stderr: str) -> None:
    """In the forked process: the environment, working directory, session and output of a fresh
    ``python -m project``."""
    os.setsid()  # its own process group, as Popen(start_new_session=True): killpg reaches its loader workers too
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.path.insert(0, cwd)  # python -m puts the working directory first
    for fd, path in ((1, stdout), (2, stderr)):
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(out, fd)
        os.close(out)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 (fd 1 stays open for the exit)
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.argv = [sys.executable, *args]  # what a launcher or a provenance record reads
    for action in filter(None, env.get("PYTHONWARNINGS", "").split(",")):  # read at start, which was the server's
        warnings.simplefilter(action.split(":")[0])  # type: ignore[arg-type]  # in front, as at start
    import torch

    torch.set_num_threads(int(env.get("OMP_NUM_THREADS", "1")))  # read at import, which was the server's
    from project.engine import main

    code = 0
    try:
        main(list(args))
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class Forked:
    """``python -m project *args`` forked from the preloaded interpreter: ``subprocess.Popen``'s ``pid``, ``args``,
    ``poll``, ``wait`` and ``returncode`` (negative: the signal that ended it)."""

    def __init__(self, args: Sequence[str], env: dict[str, str], cwd: Path, stdout: Path, stderr: Path) -> None:
        self.args = [sys.executable, "-m", "project", *args]
        self._process = _context.Process(target=_main, args=(list(args), env, str(cwd), str(stdout), str(stderr)))
        self._process.start()
        self.pid: int = self._process.pid  # type: ignore[assignment]

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return self._process.exitcode


def start(*args: str, env: dict[str, str], cwd: Path, stdout: Path | str, stderr: Path | str) -> Forked:
    """``python -m project *args`` in ``cwd`` with exactly ``env``, its output appended to the files ``stdout`` and
    ``stderr`` (the same file, or os.devnull, as a test needs)."""
    return Forked(args, env, cwd, Path(stdout), Path(stderr))


def ranks(
    *args: str, world_size: int, env: dict[str, str], cwd: Path, logs: Path, timeout: float
) -> subprocess.CompletedProcess[str]:
    """``python -m project *args`` as ``world_size`` DDP ranks on this machine (``env`` holds ``MASTER_ADDR`` and
    ``MASTER_PORT``). The return code is the first non-zero one; the output is every rank's, rank 0's first. Past
    ``timeout`` every rank is killed and the return code is -9."""
    processes, outputs = [], []
    for rank in range(world_size):
        log = logs / f"rank{rank}.log"
        rank_env = {**env, "LOCAL_RANK": str(rank), "NODE_RANK": "0", "WORLD_SIZE": str(world_size)}
        processes.append(start(*args, env=rank_env, cwd=cwd, stdout=log, stderr=log))
        outputs.append(log)
    deadline = time.monotonic() + timeout  # a hang's limit, not a speed check: then the test fails, saying so
    codes = []
    for process in processes:
        try:
            codes.append(process.wait(max(0.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            codes.append(process.wait())
    out = "".join(log.read_text(errors="replace") if log.exists() else "" for log in outputs)
    code = next((c for c in codes if c), 0)
    return subprocess.CompletedProcess(list(args), code, out, out)
