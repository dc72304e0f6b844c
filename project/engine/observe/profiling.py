"""`make profile`: a few dozen training steps under ``torch.profiler``, after a warm-up."""

import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.profiler import ProfilerActivity, profile

from project.engine.errors import ConfigError
from project.engine.hooks import defined_hooks_only


@defined_hooks_only
class ProfileSteps(L.Callback):
    """Profiles optimizer steps ``warmup`` .. ``warmup + steps`` (CPU, and CUDA when training on it; shapes and
    memory), then writes ``<run dir>/trace.json`` (open it in chrome://tracing or https://ui.perfetto.dev) and
    prints (and saves as ``<run dir>/profile.txt``) the ops that took the most self time (CUDA time on a GPU, else
    CPU) and the fraction of wall time the steps waited for data. A run that ends inside the window (its epochs
    run out) still gets its report, of the steps it profiled."""

    def __init__(self, warmup: int = 5, steps: int = 30, row_limit: int = 15) -> None:
        self.warmup, self.steps, self.row_limit = warmup, steps, row_limit
        self._profiler: profile | None = None
        self._done = False
        self._wait_at_start = 0.0
        self._started_at = 0.0

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        end = self.warmup + self.steps
        if stage == "fit" and 0 <= trainer.max_steps < end:
            raise ConfigError(
                f"trainer.callbacks.steps={self.steps}: ProfileSteps profiles optimizer steps {self.warmup}.."
                f"{end - 1}, but the run stops at trainer.max_steps={trainer.max_steps}; give "
                f"--trainer.max_steps={end} (or more), or fewer steps."
            )

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *_: Any) -> None:
        if self._profiler is not None or self._done or trainer.global_step < self.warmup:
            return
        activities = [ProfilerActivity.CPU]
        if pl_module.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        self._profiler = profile(activities=activities, record_shapes=True, profile_memory=True)
        self._profiler.__enter__()
        self._wait_at_start = getattr(trainer.train_dataloader, "wait_seconds", 0.0)
        self._started_at = time.perf_counter()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *_: Any) -> None:
        if self._profiler is not None and trainer.global_step >= self.warmup + self.steps:
            self._report(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._profiler is not None:  # the run ended inside the window
            self._report(trainer, pl_module)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # A run that crashed inside the window: a profiler left running segfaults the interpreter at exit.
        if self._profiler is not None:
            self._profiler.__exit__(None, None, None)
            self._profiler = None

    def _report(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        assert self._profiler is not None
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize()  # once, so the profiled window holds the GPU work it queued
        elapsed = time.perf_counter() - self._started_at
        waited = getattr(trainer.train_dataloader, "wait_seconds", 0.0) - self._wait_at_start
        self._profiler.__exit__(None, None, None)
        profiler, self._profiler, self._done = self._profiler, None, True
        if not trainer.is_global_zero:
            return
        run_dir = Path(trainer.log_dir or ".")
        trace = run_dir / "trace.json"
        profiler.export_chrome_trace(str(trace))
        sort_by = "self_cuda_time_total" if pl_module.device.type == "cuda" else "self_cpu_time_total"
        last, planned = trainer.global_step - 1, self.warmup + self.steps - 1
        short = "" if last >= planned else f" (the run ended before step {planned})"
        report = (
            f"{profiler.key_averages().table(sort_by=sort_by, row_limit=self.row_limit)}\n"
            f"Profiled optimizer steps {self.warmup}..{last}{short} ({elapsed:.2f} s): data wait "
            f"{waited / elapsed:.1%} of the time. Trace: {trace} (chrome://tracing or https://ui.perfetto.dev)\n"
        )
        (run_dir / "profile.txt").write_text(report)  # the console may be a progress bar's, or gone
        print(report, end="")
