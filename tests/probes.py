"""Instruments for the mechanics tests, added to a real run with ``--trainer.callbacks+=probes.Recorder``."""

import json
import os
import random
import time
from pathlib import Path
from typing import Any, ClassVar

import lightning as L
import numpy as np
import torch
from torch.utils.data import Dataset
from toy import Classifier, Digits

from project.engine import DivergenceGuard, LastCheckpoint, Provenance
from project.engine.data import batches


class RecordingDataset(Dataset):
    """Wraps a dataset and remembers which indices were fetched, in order (num_workers=0 only)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.seen = inner, []

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int) -> Any:
        self.seen.append(int(index))
        return self.inner[index]


class Recorder(L.Callback):
    """Records what a run really did, per rank: the samples of every training batch, the LR of every param
    group at every optimizer step (as the optimizer is about to use it), the pre-clip gradients, the mode the
    model is in at every batch, and the final weights. Saves it all to ``out_dir/rank<N>.pt`` if given."""

    def __init__(self, out_dir: str | None = None, keep_grads: bool = False) -> None:
        self.out_dir, self.keep_grads = out_dir, keep_grads
        self.dataset: RecordingDataset | None = None
        self.batch_sizes: list[int] = []
        self.lrs: list[list[float]] = []
        self.grad_norms: list[float] = []
        self.grads: list[torch.Tensor] = []
        self.grads_were_none: list[bool] = []
        self.modes: list[tuple[str, bool, bool, bool]] = []  # (stage, module.training, grad enabled, deterministic)
        self.final_state: dict[str, torch.Tensor] = {}

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        dm = trainer.datamodule
        if stage == "fit" and dm is not None and not isinstance(dm.train_set, RecordingDataset):
            dm.train_set = self.dataset = RecordingDataset(dm.train_set)

    def batches(self) -> list[list[int]]:
        """The training samples of each batch, in the order they were trained on."""
        assert self.dataset is not None
        seen, out = self.dataset.seen, []
        for size in self.batch_sizes:
            out.append(seen[:size])
            seen = seen[size:]
        return out

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.dataset is not None:  # what setup read (e.g. a task's statistics of the targets) is no batch
            self.dataset.seen.clear()

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int) -> None:
        self.batch_sizes.append(batches.size(pl_module.split_batch(batch)[0]))  # type: ignore[operator]
        self.modes.append(("train", pl_module.training, torch.is_grad_enabled(), False))

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        self.grads_were_none.append(all(p.grad is None for p in pl_module.parameters()))

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        self.lrs.append([group["lr"] for group in optimizer.param_groups])
        from torch.distributed.tensor import DTensor

        # FSDP's gradients are shards: gathered whole (a collective, on every rank).
        grads = [(p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).detach().flatten()
                 for p in pl_module.parameters() if p.grad is not None]  # fmt: skip
        flat = torch.cat(grads)  # in the run's own dtype: a float64 run is compared in float64
        self.grad_norms.append(flat.float().norm().item())
        if self.keep_grads:
            self.grads.append(flat.clone())

    def _eval_probe(self, stage: str, pl_module: L.LightningModule, batch: Any) -> None:
        # Two forwards on the same batch agree only if dropout is off (eval mode).
        inputs = pl_module.split_batch(batch)[0]  # type: ignore[operator]
        same = torch.equal(pl_module(inputs), pl_module(inputs))
        self.modes.append((stage, pl_module.training, torch.is_grad_enabled(), same))

    def on_validation_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, *_: Any) -> None:
        self._eval_probe("val", pl_module, batch)

    def on_test_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, *_: Any) -> None:
        self._eval_probe("test", pl_module, batch)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.final_state = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit" or self.out_dir is None:
            return
        stopper, checkpoint = trainer.early_stopping_callback, trainer.checkpoint_callback
        provenance = next((cb for cb in trainer.callbacks if isinstance(cb, Provenance)), None)  # type: ignore[attr-defined]
        record = {
            "pid": os.getpid(),
            "writes_provenance": provenance is not None and provenance.path is not None,  # where it would write
            "world_size": trainer.world_size,
            "global_step": trainer.global_step,
            "total_steps": int(trainer.estimated_stepping_batches),
            "batches": self.batches(),
            "lrs": self.lrs,
            "grad_norms": self.grad_norms,
            "grads": self.grads,
            "final_state": self.final_state,
            "should_stop": trainer.should_stop,
            "stopper": None if stopper is None else (stopper.wait_count, float(stopper.best_score)),
            "best_score": None if checkpoint is None else float(getattr(checkpoint, "best_model_score", 0.0)),
        }
        Path(self.out_dir).mkdir(parents=True, exist_ok=True)
        torch.save(record, Path(self.out_dir) / f"rank{trainer.global_rank}.pt")


class PoisonWeights(L.Callback):
    """Fills every weight with NaN at the start of training epoch ``epoch``: that epoch's val/loss is not finite."""

    def __init__(self, epoch: int = 1) -> None:
        self.epoch = epoch

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch == self.epoch:
            with torch.no_grad():
                for p in pl_module.parameters():
                    p.fill_(float("nan"))


class InfGradAt(L.Callback):
    """Puts an inf into one gradient after the backward of optimizer step ``step`` (before AMP unscaling, where
    the GradScaler looks for infs), and records the weights and the loss scale around that step."""

    def __init__(self, step: int = 2) -> None:
        self.step = step
        self.before: dict[str, torch.Tensor] = {}
        self.after: dict[str, torch.Tensor] = {}
        self.scales: list[float] = []

    def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.global_step == self.step:
            self.before = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}
            self.scales.append(trainer.precision_plugin.scaler.get_scale())
            next(p for p in pl_module.parameters() if p.grad is not None).grad.view(-1)[0] = float("inf")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *_: Any) -> None:
        if trainer.global_step == self.step + 1 and not self.after:
            self.after = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}
            self.scales.append(trainer.precision_plugin.scaler.get_scale())


class ScaleAtStart(L.Callback):
    """The GradScaler's scale when training starts (after any checkpoint was restored)."""

    def __init__(self) -> None:
        self.scale: float | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.scale = trainer.precision_plugin.scaler.get_scale()


class Crash(RuntimeError):
    pass


class CrashAt(L.Callback):
    """Dies like a killed process (an exception, nothing saved) when optimizer step ``step`` is about to start,
    or when epoch ``epoch`` is about to start. With ``signal`` set it sends itself that signal instead."""

    def __init__(self, step: int | None = None, epoch: int | None = None, signal: int | None = None) -> None:
        self.step, self.epoch, self.signal = step, epoch, signal

    def _fire(self) -> None:
        if self.signal is None:
            raise Crash("simulated crash")
        import os

        os.kill(os.getpid(), self.signal)
        self.step = self.epoch = None  # once

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *_: Any) -> None:
        if trainer.global_step == self.step:
            self._fire()

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch == self.epoch:
            self._fire()


class NoSyncSteps(L.Callback):
    """Makes any host-device sync raise during training steps that the logger does not write."""

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *_: Any) -> None:
        if (trainer.global_step + 1) % trainer.log_every_n_steps != 0:  # type: ignore[attr-defined]
            torch.cuda.set_sync_debug_mode("error")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *_: Any) -> None:
        torch.cuda.set_sync_debug_mode("default")


class FullStateAtSteps(L.Callback):
    """The full weights and full (pre-clip) gradients at each of the first ``steps`` optimizer steps, gathered from
    FSDP's shards on every rank (a collective), saved by rank 0 to ``out`` as a list of (weights, grads)."""

    def __init__(self, out: str, steps: int = 3) -> None:
        self.out, self.steps = out, steps
        self.records: list[tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]] = []

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        if trainer.global_step >= self.steps:
            return
        from torch.distributed.tensor import DTensor

        def full(t: torch.Tensor) -> torch.Tensor:
            return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()

        params = list(pl_module.net.named_parameters())
        self.records.append(({n: full(p) for n, p in params}, {n: full(p.grad) for n, p in params}))

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero:
            torch.save(self.records, self.out)


class NoDropout(L.Callback):
    """Switches every dropout off before training: equivalence runs that draw their masks in different orders
    (another batch split, another process) then compute the same function, whatever the net. Every ``nn.Dropout*``
    gets p=0, and so does every float attribute of a module whose name says dropout: ``nn.MultiheadAttention``'s
    (in every ``nn.Transformer*`` layer), transformers' ``attention_dropout``, a p a module of one's own hands to
    ``F.scaled_dot_product_attention`` or ``F.dropout``."""

    def setup(self, trainer: L.Trainer, pl_module: torch.nn.Module, stage: str) -> None:
        for module in pl_module.modules():
            if isinstance(module, torch.nn.modules.dropout._DropoutNd):
                module.p = 0.0
            for name, value in list(vars(module).items()):
                if "dropout" in name.lower() and isinstance(value, float):
                    setattr(module, name, 0.0)


class OwnTrainingStep(Classifier):
    """A task whose ``training_step`` is its own (computes the loss itself, calls no engine code): the engine's
    mechanics, the accumulation correction among them, must hold anyway."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)


class Hold(L.Callback):
    """Holds training as epoch ``epoch`` starts until the file ``release`` exists or the run was told to stop
    (Ctrl-C/SIGTERM, as ``LastCheckpoint`` records it), touching ``<release>.held-rank<N>`` and, when it lets go,
    ``<release>.left-rank<N>``: a test that interrupts a run then knows it is mid-run, whatever the machine's speed,
    and waits for that state rather than for time."""

    def __init__(self, release: str, epoch: int = 1) -> None:
        self.release, self.epoch = Path(release), epoch

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch != self.epoch:
            return
        stopper = next((cb for cb in trainer.callbacks if isinstance(cb, LastCheckpoint)), None)  # type: ignore[attr-defined]
        # The state a test waits for; it holds the pids of the loaders' worker processes, by loader.
        loaders = {"train": trainer.train_dataloader, "val": trainer.val_dataloaders}
        workers = {name: [w.pid for w in getattr(getattr(loader, "_iterator", None), "_workers", [])]
                   for name, loader in loaders.items()}  # fmt: skip
        Path(f"{self.release}.held-rank{trainer.global_rank}").write_text(json.dumps(workers))
        while not self.release.exists() and (stopper is None or (stopper.signum or stopper.worker_death) is None):
            time.sleep(0.05)
        Path(f"{self.release}.left-rank{trainer.global_rank}").touch()


class FillDisk(L.Callback):
    """Fills the filesystem holding ``path`` (a file it creates) right before the checkpoints of epoch ``epoch``
    are written (at the end of its validation): a real full disk, as the run meets it. Once: the file ``done``
    (elsewhere) records it, so the resumed run, whose config names this callback too, trains on."""

    def __init__(self, path: str, done: str, epoch: int = 1) -> None:
        self.path, self.done, self.epoch = Path(path), Path(done), epoch

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.current_epoch != self.epoch or self.done.exists():
            return
        self.done.touch()
        with open(self.path, "wb", buffering=0) as f:  # unbuffered: every byte written is on the disk
            for size in (2**20, 2**12, 1):  # MiB blocks, then smaller ones into what is left
                try:
                    while True:
                        f.write(b"\0" * size)
                except OSError:
                    pass


class _Jittered(Dataset):
    def __init__(self, inner: Dataset) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        x, y = self.inner[index]
        return x + float(np.random.normal(0.0, 0.05)) + random.uniform(-0.05, 0.05), y


class JitteredDigits(Digits):
    """Digits whose training samples are jittered with NumPy's and Python's global RNGs, as an augmentation
    written with ``np.random``/``random`` and loaded without workers (in the training process) would be."""

    def load_splits(self) -> tuple[Dataset, Dataset, Dataset]:
        train, val, test = super().load_splits()
        return _Jittered(train), val, test


class UnpackingDigits(Digits):
    """Digits whose ``on_after_batch_transfer`` unpacks (inputs, targets), as a GPU augmentation written there would."""

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        x, y = super().on_after_batch_transfer(batch, dataloader_idx)
        return x, y


class Snapshots(L.Callback):
    """The net's state_dict (copies) at the start of training and at the end of every training epoch, in
    ``Snapshots.taken``: {"start": ..., 0: ..., 1: ...}. Class-level: the CLI builds the callback from its class
    path."""

    taken: ClassVar[dict[Any, dict[str, torch.Tensor]]] = {}

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        Snapshots.taken = {"start": _copy(pl_module.net)}

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        Snapshots.taken[trainer.current_epoch] = _copy(pl_module.net)


def _copy(net: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


class EvalOutputs(L.Callback):
    """What each evaluation batch hands its callbacks: (stage, the outputs equal the model's on the batch, the targets
    equal the batch's)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, bool, bool]] = []

    def _check(self, stage: str, pl_module: L.LightningModule, outputs: Any, batch: Any) -> None:
        with torch.no_grad():
            again = pl_module(batch[0])
        self.seen.append((stage, torch.equal(outputs["outputs"], again), torch.equal(outputs["targets"], batch[1])))

    def on_validation_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:  # fmt: skip
        self._check("val", pl_module, outputs, batch)

    def on_test_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                          batch_idx: int, dataloader_idx: int = 0) -> None:  # fmt: skip
        self._check("test", pl_module, outputs, batch)


class WeightDtypeInForward(L.Callback):
    """The dtype of the net's first ``nn.Linear`` weight as its forward sees it (FSDP's gathered weight), at the first
    training step, saved by rank 0 to ``out``."""

    def __init__(self, out: str) -> None:
        self.out = out
        self.seen: list[str] = []

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        layer = next(m for m in pl_module.modules() if isinstance(m, torch.nn.Linear))
        self.hook = layer.register_forward_pre_hook(lambda module, args: self.seen.append(str(module.weight.dtype)))

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.hook.remove()
        if trainer.is_global_zero:
            Path(self.out).write_text(self.seen[0])


class InfGradient(L.Callback):
    """Puts an inf into one gradient after the backward of each optimizer step in ``steps`` (0-based: the step that
    ``global_step`` counts then), the loss staying finite; records every parameter just before and just after each
    such step in ``around``: {step: (before, after)}."""

    def __init__(self, steps: list[int]) -> None:
        self.steps = steps
        self.around: dict[int, tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]] = {}

    def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.global_step in self.steps and trainer.global_step not in self.around:
            self.around[trainer.global_step] = (_copy(pl_module), {})
            next(p for p in pl_module.parameters() if p.grad is not None).grad.view(-1)[0] = float("inf")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *_: Any) -> None:
        step = trainer.global_step - 1  # the step just taken
        if step in self.around and not self.around[step][1]:
            self.around[step][1].update(_copy(pl_module))


class NonFiniteOnOneRank(L.Callback):
    """Hands the run's DivergenceGuard a NaN loss at optimizer step ``step`` on process ``rank`` only (the others see
    none): what a loss that turns non-finite on one process's data alone looks like to the guards."""

    def __init__(self, rank: int = 1, step: int = 3) -> None:
        self.rank, self.step = rank, step

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *_: Any) -> None:
        if trainer.global_rank == self.rank and trainer.global_step == self.step:
            guard = next(cb for cb in trainer.callbacks if isinstance(cb, DivergenceGuard))  # type: ignore[attr-defined]
            guard._watch(trainer, torch.tensor(float("nan")), "the loss")


class PoisonBuffers(L.Callback):
    """Fills every floating-point buffer (BatchNorm's running statistics) with NaN as the validation of epoch
    ``epoch`` starts: the weights and the training loss stay finite, the evaluated loss does not."""

    def __init__(self, epoch: int = 1) -> None:
        self.epoch = epoch

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch == self.epoch and not trainer.sanity_checking:
            for buffer in pl_module.buffers():
                if buffer.is_floating_point():
                    buffer.fill_(float("nan"))


class StepWeights(L.Callback):
    """The task's raw weights and buffers (copies) after every optimizer step, in ``StepWeights.taken`` (class-level:
    the CLI builds the callback from its class path)."""

    taken: ClassVar[list[dict[str, torch.Tensor]]] = []

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        StepWeights.taken, self._step = [], trainer.global_step

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if trainer.global_step > self._step:
            StepWeights.taken.append({k: v.detach().clone() for k, v in pl_module.state_dict().items()})
            self._step = trainer.global_step
