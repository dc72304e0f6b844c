"""Processes of ``python -m project`` that start from an interpreter which has already imported torch, Lightning and
the package: multiprocessing's fork server, started once per test process with those modules preloaded, forks each
one. A fresh interpreter spends ~5 s of CPU importing them (``import lightning.pytorch`` alone ~4.5 s), which is
most of what a short run in the contract suite costs.

``ranks`` runs a DDP job as torchrun would: one forked process per rank with ``LOCAL_RANK``, ``NODE_RANK`` and
``WORLD_SIZE`` set (each rank's output in ``logs``), so Lightning launches nothing itself: its
``LightningEnvironment`` sees processes created outside it. How Lightning's own launcher starts the ranks is the
engine's concern, proven with fresh interpreters in tests/test_ddp.py (make test-all); what a user's task, data or
net can break under 2 processes is the same here.

Not for a test that signals or kills the process it started: the forked process is a child of the fork server.
"""

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

PRELOAD = ["torch", "lightning.pytorch", "project.engine.cli", "probes"]
_context = multiprocessing.get_context("forkserver")
_context.set_forkserver_preload(PRELOAD)


def _main(args: Sequence[str], env: dict[str, str], cwd: str, log: str) -> None:
    """In the forked process: the environment, working directory and output of a fresh ``python -m project``."""
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 (fd 1 stays open for the exit)
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.argv = [sys.executable, *args]  # what a launcher or a provenance record reads
    import torch

    torch.set_num_threads(int(env.get("OMP_NUM_THREADS", "1")))  # read at import, which was the server's
    from project.engine.cli import main

    code = 0
    try:
        main(list(args))
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


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
        process = _context.Process(target=_main, args=(args, rank_env, str(cwd), str(log)))
        process.start()
        processes.append(process)
        outputs.append(log)
    deadline = time.monotonic() + timeout  # a hang's limit, not a speed check: then the test fails, saying so
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    codes = []
    for process in processes:
        if process.exitcode is None:
            os.kill(process.pid, signal.SIGKILL)
            process.join()
        codes.append(process.exitcode)
    out = "".join(log.read_text(errors="replace") if log.exists() else "" for log in outputs)
    code = next((c for c in codes if c), 0)
    return subprocess.CompletedProcess(list(args), code, out, out)
