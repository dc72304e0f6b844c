import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from project.cli import CLI
from project.runs import read_scalars

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = str(ROOT / "configs" / "default.yaml")
DEBUG = str(ROOT / "configs" / "debug.yaml")


@pytest.fixture(autouse=True)
def _restore_environment() -> Iterator[None]:
    """Lightning writes PL_GLOBAL_SEED and friends into os.environ; no test may see another's."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def fit(save_dir: Path, *args: str, configs: tuple[str, ...] = (DEFAULT,)) -> CLI:
    """Run ``fit`` through the real CLI in this process, logging under ``save_dir``."""
    argv = ["fit", *(a for c in configs for a in ("--config", c))]
    return CLI([*argv, f"--trainer.logger.init_args.save_dir={save_dir}", *args])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_module(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """``python -m project ...`` in a fresh process: the real entry point, or a real Lightning DDP launch.

    Loopback only, a fresh port per call, ``tests/`` importable (for ``probes``), and on timeout the whole
    process group (Lightning's launcher and the ranks it started) is killed, so a hang cannot stall the suite.
    """
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONWARNINGS": "ignore",
        "PYTHONPATH": str(ROOT / "tests"),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "project", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"timed out after {timeout}s: python -m project {' '.join(args)}\n{err[-3000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


scalars = read_scalars  # every scalar series of a run directory: {tag: [(step, value), ...]}


def accuracy(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
    """Reference accuracy computed by hand, in eval mode, on the whole split at once."""
    model.eval()
    with torch.no_grad():
        return (model(images).argmax(dim=-1) == labels).float().mean().item()
