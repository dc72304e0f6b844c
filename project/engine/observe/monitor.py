"""Curves that answer "where is the time going": throughput, the fraction of time spent waiting for data, peak
memory. Host clocks only: nothing here synchronises with the GPU or copies a tensor to the host per step
(Lightning's ThroughputMonitor calls ``torch.cuda.synchronize()`` every batch)."""

import resource
import sys
import time
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.distributed.tensor import DTensor

from project.engine.data import batches
from project.engine.hooks import defined_hooks_only
from project.engine.model.accumulation import is_last_micro_batch, is_logging_step
from project.engine.model.metrics import IGNORE_INDEX
from project.engine.model.optimization import describe_recipe


def compute_dtype(precision: str) -> torch.dtype:
    """The dtype a Lightning precision's matmuls run in (bf16-mixed and bf16-true: bfloat16; 16-*: float16; 64-true:
    float64; else float32), the one whose peak MFU is measured against: under a mixed precision the weights stay
    float32 while the matmuls run in half precision."""
    dtypes = {"bf16": torch.bfloat16, "16": torch.float16, "64": torch.float64}
    return dtypes.get(precision.split("-")[0], torch.float32)


@defined_hooks_only
class TrainingMonitor(L.Callback):
    """Logs, on the steps the logger writes (``trainer.log_every_n_steps``), averaged over the steps since the last:

    - ``train/samples_per_sec`` and ``train/batches_per_sec`` of this process, and ``train/samples_per_sec_global``
      (this process's rate times the number of processes: every process runs the same steps in lockstep); for a
      task that counts tokens (``Task.counted``), ``train/tokens_per_sec`` and ``train/tokens_per_sec_global`` too
      (counted tokens: padding excluded);
    - ``train/flops_per_sec``: the FLOPs of one training batch (``_count_flops``, once, at the first batch) times the
      batches per second; on a GPU whose peak Lightning knows (``get_available_flops``), ``train/mfu`` too,
      against the peak of the dtype the precision's matmuls run in (``compute_dtype``: bf16-mixed, bfloat16's);
    - ``train/grad_norm``: the total gradient norm before clipping (after accumulation and AMP unscaling);
    - ``train/data_wait``: the fraction of wall time spent waiting for the next batch from the DataLoader
      (timed inside the loader when it offers ``wait_seconds``, as ``ResumableDataLoader`` does; otherwise the
      time between one batch's end and the next one's start, which also counts Lightning's own per-step work).
      Above ``data_wait_warn`` a one-time warning suggests workers.

    Per epoch: ``train/peak_gpu_mem_mb`` (``torch.cuda.max_memory_allocated``, reset each epoch) on CUDA, else
    ``train/peak_rss_mb`` (the process's peak resident memory so far). Without a terminal (CI, a log file) it also
    prints one line per epoch, since the progress bar then only draws its final state.
    """

    def __init__(self, data_wait_warn: float = 0.2) -> None:
        self.data_wait_warn = data_wait_warn
        self._warned = False
        self._last_end: float | None = None
        self._window_start = 0.0
        self._wait = 0.0
        self._samples = 0
        self._batches = 0
        self._windows = 0
        self._epoch_start = 0.0
        self._loader_wait_seen = 0.0
        self._tokens: Any = 0
        self._flops_per_batch: int | None = None
        self._peak_flops: float | None = None
        self._validated_in: int | None = None  # the epoch of the last validation (not the sanity check)

    def _reset_window(self, now: float) -> None:
        self._window_start, self._wait, self._samples, self._batches, self._tokens = now, 0.0, 0, 0, 0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._epoch_start = time.perf_counter()  # a run resumed mid-epoch starts no epoch
        rank_zero_info(describe_recipe(trainer))

    def _count_flops(self, pl_module: L.LightningModule, batch: Any) -> None:
        """3 x the FLOPs of one forward of the first batch (the backward costs twice the forward: Kaplan et al.'s
        6N per token), counted by torch's FlopCounterMode, once: in eval mode without autograd and with the RNG
        state restored, so the run's results are untouched. Not for a compiled net (it would compile again)."""
        from torch.utils.flop_counter import FlopCounterMode

        self._flops_per_batch = 0
        if pl_module.hparams.get("compile"):
            return
        training = pl_module.training
        try:
            with torch.random.fork_rng(devices=[]), torch.no_grad(), FlopCounterMode(display=False) as counter:
                pl_module.eval()
                pl_module(pl_module.split_batch(batch)[0])  # type: ignore[operator]
        finally:
            pl_module.train(training)
        self._flops_per_batch = 3 * counter.get_total_flops()
        rank_zero_info(f"FLOPs per training batch: {self._flops_per_batch:.3g} (3 x its forward's)")
        if pl_module.device.type == "cuda":
            from lightning.fabric.utilities.throughput import get_available_flops

            self._peak_flops = get_available_flops(pl_module.device, compute_dtype(str(pl_module.trainer.precision)))

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *_: Any) -> None:
        now = time.perf_counter()
        if self._last_end is None:
            self._reset_window(now)
            self._loader_wait_seen = getattr(trainer.train_dataloader, "wait_seconds", 0.0)
        elif not hasattr(trainer.train_dataloader, "wait_seconds"):
            self._wait += now - self._last_end

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._flops_per_batch is None:
            self._count_flops(pl_module, batch)
        now = self._last_end = time.perf_counter()
        inputs, targets = pl_module.split_batch(batch)  # type: ignore[operator]
        self._samples += batches.size(inputs)
        if getattr(pl_module, "counted", "samples") == "tokens":
            self._tokens = self._tokens + (targets != IGNORE_INDEX).sum()  # on the device: read once per window
        self._batches += 1
        every = trainer.log_every_n_steps  # type: ignore[attr-defined]
        # After an optimizer step's last micro-batch only (its private read: model/accumulation.py).
        if every <= 0 or not is_last_micro_batch(trainer) or trainer.global_step % every != 0:
            return
        elapsed = max(now - self._window_start, 1e-9)
        loader_wait = getattr(trainer.train_dataloader, "wait_seconds", None)
        if loader_wait is not None:
            self._wait, self._loader_wait_seen = loader_wait - self._loader_wait_seen, loader_wait
        data_wait = self._wait / elapsed
        samples_per_sec = self._samples / elapsed
        values = {
            "train/samples_per_sec": samples_per_sec,
            "train/batches_per_sec": self._batches / elapsed,
            "train/samples_per_sec_global": samples_per_sec * trainer.world_size,
            "train/data_wait": data_wait,
        }
        if not isinstance(self._tokens, int):  # one host read per logging step
            tokens_per_sec = float(self._tokens) / elapsed
            values.update(
                {
                    "train/tokens_per_sec": tokens_per_sec,
                    "train/tokens_per_sec_global": tokens_per_sec * trainer.world_size,
                }
            )
        if self._flops_per_batch:
            values["train/flops_per_sec"] = self._flops_per_batch * self._batches / elapsed
            if self._peak_flops:
                values["train/mfu"] = values["train/flops_per_sec"] / self._peak_flops
        # Straight to the loggers (rank 0 only), at the step Lightning writes this step's metrics under: these
        # are host floats nobody monitors, and self.log would add ~0.5 ms of bookkeeping per value.
        for logger in trainer.loggers:
            logger.log_metrics(values, step=trainer.global_step - 1)
        self._windows += 1
        # The first window includes warm-up (first batches, allocator growth): judge from the second on.
        if self._windows > 1 and data_wait > self.data_wait_warn and not self._warned:
            self._warned = True
            rank_zero_warn(
                f"train/data_wait = {data_wait:.0%}: the training step waits for the DataLoader {data_wait:.0%} of "
                "the time. Try data.num_workers > 0 (with data.persistent_workers: true) and, on a GPU, "
                "data.pin_memory: true; or make __getitem__ cheaper."
            )
        self._reset_window(now)

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        # Once per optimizer step, before clipping: the true pre-clip norm. On the device (one fused reduction, no host
        # copy per parameter), on the steps the logger writes.
        if is_logging_step(trainer):
            norm = torch.nn.utils.get_total_norm([p.grad for p in pl_module.parameters() if p.grad is not None])
            if isinstance(norm, DTensor):  # sharded gradients (FSDP): the norm over all shards
                norm = norm.full_tensor()
            pl_module.log("train/grad_norm", norm, on_step=True, on_epoch=False)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # A run validated by steps (val_check_interval in batches, as language models are) may never end an epoch:
        # without a terminal, a line per validation then shows it progressing.
        if not trainer.sanity_checking:
            self._validated_in = trainer.current_epoch
        by_steps = trainer.check_val_every_n_epoch is None or trainer.val_check_interval != 1.0
        if trainer.sanity_checking or not by_steps or sys.stdout.isatty():
            return
        metrics = trainer.callback_metrics
        judged = getattr(pl_module, "monitor", "val/loss")
        shown = "  ".join(f"{k}={float(metrics[k]):.4f}" for k in dict.fromkeys(("val/loss", judged)) if k in metrics)
        rank_zero_info(f"step {trainer.global_step}: {shown}  ({time.perf_counter() - self._epoch_start:.1f} s)")

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if pl_module.device.type == "cuda":
            peak = {"train/peak_gpu_mem_mb": torch.cuda.max_memory_allocated(pl_module.device) / 2**20}
        else:  # ru_maxrss is in KiB on Linux
            peak = {"train/peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
        pl_module.log_dict(peak, on_step=False, on_epoch=True)
        if not sys.stdout.isatty():
            metrics = trainer.callback_metrics
            judged = getattr(pl_module, "monitor", "val/loss")
            # An epoch without a validation (check_val_every_n_epoch) shows none: the figures are an earlier one's.
            shown_keys = [k for k in dict.fromkeys(("val/loss", judged)) if k in metrics]
            shown = "  ".join(
                f"{k}={float(metrics[k]):.4f}" for k in shown_keys if self._validated_in == trainer.current_epoch
            )
            took = time.perf_counter() - self._epoch_start
            rank_zero_info(f"epoch {trainer.current_epoch}: {shown}  ({took:.1f} s)")
