"""Writing checkpoints so that a crash never leaves a truncated one, and reading them without running code."""

import errno
import os
import pickle
import shutil
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins import TorchCheckpointIO
from lightning.pytorch.plugins.io import AsyncCheckpointIO
from lightning_utilities.core.apply_func import apply_to_collection

from project.engine.errors import ConfigError

DISK_FULL = (errno.ENOSPC, errno.EDQUOT)  # the errnos of a write that found no space


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (a full disk, a lost mount); the file it was to replace is untouched."""


def free_space(path: Path) -> str:
    try:
        return f"{shutil.disk_usage(path).free / 2**20:.1f} MB free there"
    except OSError:
        return "its free space unknown"


def _write_failed(path: Path, err: BaseException) -> CheckpointWriteError:
    # torch.save reports a failed write as a RuntimeError of its zip writer ("unexpected pos ..."), without errno.
    full = getattr(err, "errno", None) in DISK_FULL or isinstance(err, RuntimeError)
    why = "no space left on the device" if full else (str(err).strip().splitlines() or [type(err).__name__])[0]
    return CheckpointWriteError(
        errno.ENOSPC if full else getattr(err, "errno", None) or errno.EIO,
        f"could not write the checkpoint {path} ({why}: {free_space(path.parent)}); the checkpoints already in "
        f"{path.parent} are untouched. Free some space, then continue the run: make resume RUN={path.parent.parent}",
    )


class AtomicCheckpointIO(TorchCheckpointIO):
    """Writes ``<dir>/.<name>.tmp-<pid>`` in the checkpoint's own directory, flushes and fsyncs it, renames it
    over ``<name>`` (atomic on one filesystem) and fsyncs the directory. A kill or power loss at any instant
    leaves the old file or the new one, never a truncated one. Lightning's own save stages the file in $TMPDIR,
    which is only atomic when that is the same filesystem, and never fsyncs (#21253)."""

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
        try:
            with open(tmp, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except (OSError, RuntimeError) as err:  # a full disk, a lost mount: no half-written file is left
            tmp.unlink(missing_ok=True)
            raise _write_failed(path, err) from None
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


class BackgroundCheckpointIO(AsyncCheckpointIO):
    """Saves without stalling training: the training thread only snapshots the checkpoint into host memory (a
    device-to-host copy of each tensor, or a clone on the CPU); a background thread serialises, writes, fsyncs and
    renames it with ``AtomicCheckpointIO``, so every guarantee of the atomic writer holds (a kill at any instant
    leaves the old file or the new one; the content, hence the resume, is the same as a blocking save's).

    On top of Lightning's ``AsyncCheckpointIO`` (which clones on the device, and queues saves without bound): at
    most one save in flight, the next save (or a removal, or a load) waits for it, so host memory holds at most one
    snapshot and ModelCheckpoint's removal of an old file cannot race its write; a failed write is raised on the
    training thread at the next save, or at the end of fit (teardown). Enable it with
    ``trainer.plugins: [project.engine.checkpointing.checkpoint_io.BackgroundCheckpointIO]`` (configs/gpu.yaml does).
    """

    def __init__(self) -> None:
        super().__init__(AtomicCheckpointIO())
        self._pending: Future | None = None

    def wait(self) -> None:
        """Block until the save in flight, if any, is on disk; raise its error here if it failed."""
        if self._pending is not None:
            self._pending.result()
            self._pending = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        self.wait()
        snapshot = apply_to_collection(checkpoint, torch.Tensor, _to_host)
        self._ensure_setup()
        assert self._executor is not None and self.checkpoint_io is not None
        writer = self.checkpoint_io

        def write() -> None:
            try:
                writer.save_checkpoint(snapshot, path, storage_options)
            except BaseException as err:  # surfaced by wait() on the training thread
                self._error = err

        self._pending = self._executor.submit(write)

    def remove_checkpoint(self, path: Any) -> None:
        self.wait()
        super().remove_checkpoint(path)

    def load_checkpoint(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.wait()
        return super().load_checkpoint(*args, **kwargs)

    def teardown(self) -> None:
        try:
            self.wait()
        finally:
            super().teardown()


def _to_host(tensor: torch.Tensor) -> torch.Tensor:
    """A point-in-time copy in host memory: training may change the original in place right after."""
    tensor = tensor.detach()
    return tensor.to("cpu") if tensor.device.type != "cpu" else tensor.clone()


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


def check_fits(own: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> None:
    """A checkpoint's weights (``theirs``) fit this model's (``own``): the same names and shapes, or one sentence."""
    if theirs and own.keys() != theirs.keys():
        missing, unexpected = sorted(own.keys() - theirs.keys()), sorted(theirs.keys() - own.keys())
        raise ConfigError(
            f"The checkpoint does not fit this model (another model.net or task?): parameters missing from "
            f"it: {missing[:3]}, unknown to this model: {unexpected[:3]}."
        )
    for name, tensor in theirs.items():
        if tensor.shape != own[name].shape:
            raise ConfigError(
                f"The checkpoint does not fit this model (another model.net?): {name} has shape "
                f"{tuple(tensor.shape)} in the checkpoint but {tuple(own[name].shape)} here."
            )
