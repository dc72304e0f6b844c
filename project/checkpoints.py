"""Writing checkpoints so that a crash never leaves a truncated one, and reading them without running code."""

import os
import pickle
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins import TorchCheckpointIO

from project.errors import ConfigError


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes ``<dir>/.<name>.tmp-<pid>`` in the checkpoint's own directory, flushes and fsyncs it, renames it
    over ``<name>`` (atomic on one filesystem) and fsyncs the directory. A kill or power loss at any instant
    leaves the old file or the new one, never a truncated one. Lightning's own save stages the file in $TMPDIR,
    which is only atomic when that is the same filesystem, and never fsyncs (#21253, notes §4)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if "://" in str(path):  # remote storage: leave it to fsspec
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Temp files left by a writer that was killed (only one process writes a run's checkpoints); they never
        # end in .ckpt, so nothing ever mistakes one for a checkpoint meanwhile.
        for stale in path.parent.glob(".*.ckpt.tmp-*"):
            stale.unlink(missing_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        with open(tmp, "wb") as f:
            torch.save(checkpoint, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """``torch.load(path, weights_only=True)`` with one clear sentence for each way it can fail."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"ckpt_path={str(path)!r}: no such checkpoint file.")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise ConfigError(
            f"ckpt_path={str(path)!r} holds Python objects other than tensors and plain data, which could run code "
            f"when unpickled; it was refused, nothing in it was executed ({str(err).splitlines()[0]})."
        ) from None
    except Exception as err:
        raise ConfigError(
            f"ckpt_path={str(path)!r} is not a readable checkpoint (truncated, or not a file written by torch.save):"
            f" {str(err).splitlines()[0]}"
        ) from None
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise ConfigError(f"ckpt_path={str(path)!r} is not a Lightning checkpoint (it has no 'state_dict').")
    return checkpoint
