"""An exponential moving average of the task's weights: Lightning's ``WeightAveraging`` (its swap for validation,
its checkpoint layout), updated without a host sync and evaluated wherever a checkpoint is.

List it in ``trainer.callbacks`` (``--trainer.callbacks+=project.engine.EMA``, ``--trainer.callbacks.decay=``).
After each optimizer step ``average = decay * average + (1 - decay) * weights`` (the first step copies the weights).
Validation, and so ``best.ckpt``'s choice and early stopping, sees the average; training goes on from the raw
weights. Each checkpoint holds the average as its ``state_dict`` (what ``test``, ``predict``, ``export`` and a
fine-tune load) and the raw weights beside it, which a resumed ``fit`` trains on: the resume is bitwise, the
average included. BatchNorm's running statistics are averaged like the weights; its batch counter is copied.
A parameter that needs no gradient when training starts (a LoRA fine-tune's frozen base) is the task's own in the
average, neither copied nor updated; should it start training later, the average copies it then and averages it on.
``warmup: true`` lowers the decay of the early steps to ``min(decay, (1 + step) / (10 + step))`` (TensorFlow's
``ExponentialMovingAverage(num_updates=)``): the average then forgets the first, untrained weights within a few steps
instead of ~1 / (1 - decay).
"""

import copy
import itertools
from typing import Any, cast

import lightning as L
import torch
from lightning.pytorch.callbacks import WeightAveraging
from lightning.pytorch.strategies import FSDPStrategy
from lightning.pytorch.trainer.states import TrainerFn
from torch import Tensor, nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from project.engine.errors import ConfigError

# (the average's floating tensors, the task's), then (average, task) for each integer buffer
_Tensors = tuple[tuple[list[Tensor], list[Tensor]], list[tuple[Tensor, Tensor]]]


class EMA(WeightAveraging):
    def __init__(self, decay: float = 0.999, warmup: bool = False) -> None:
        """
        Args:
            decay: the weight of the average at each step, in [0, 1): 0.999 averages over ~1,000 steps.
            warmup: step t's decay is ``min(decay, (1 + t) / (10 + t))``: short averages while the weights move fast.
        """
        if not 0.0 <= decay < 1.0:
            raise ConfigError(f"EMA decay={decay}: give a number in [0, 1), e.g. 0.999 (an average over ~1,000 steps).")
        super().__init__(use_buffers=True)
        self.decay, self.warmup = decay, warmup

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        if isinstance(trainer.strategy, FSDPStrategy) or getattr(pl_module, "device_mesh", None) is not None:
            raise ConfigError(
                "EMA with a sharded strategy (fsdp): the average would be a whole unsharded copy of the weights on "
                "every process (Lightning's WeightAveraging does not shard); use it with ddp, or take EMA out of "
                "trainer.callbacks."
            )
        # Lightning's setup first calls configure_model, for a module that builds its layers there: a task builds
        # its net in __init__ and only compiles or shards it there, which the average need not copy.
        sharing = cast(nn.Module, _SharingFrozen(pl_module))  # all AveragedModel does with it is deepcopy
        self._average_model = AveragedModel(model=sharing, device=pl_module.device, use_buffers=True)
        live = dict(pl_module.named_parameters())
        self._shared = [(n, p) for n, p in self._average_model.module.named_parameters() if p is live.get(n)]
        self._tensors: _Tensors | None = None  # what _update reads, listed at its first call after this
        # In the dtype the precision plugin gives the task later (64-true, bf16-true), before a resume loads into it.
        trainer.precision_plugin.convert_module(self._average_model.module)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        # Once per optimizer step (global_step counts those, under accumulation and manual optimization alike).
        # torch's AveragedModel.update_parameters reads its counter on the host twice per update; here the first
        # update is known from the step already.
        if trainer.global_step > self._latest_update_step:
            step = trainer.global_step  # a host int: the decay costs no device read
            decay = min(self.decay, (1 + step) / (10 + step)) if self.warmup else self.decay
            self._update(pl_module, decay, first=self._latest_update_step == 0)
            self._latest_update_step = step

    @torch.no_grad()
    def _update(self, pl_module: L.LightningModule, decay: float, first: bool) -> None:
        assert self._average_model is not None
        if any(p.requires_grad for _, p in self._shared):  # unfrozen since: a copy of its own, averaged from now on
            average = self._average_model.module
            for name, p in (shared for shared in self._shared if shared[1].requires_grad):
                owner, _, attribute = name.rpartition(".")
                setattr(average.get_submodule(owner), attribute, nn.Parameter(p.detach().clone()))
            self._shared, self._tensors = [(n, p) for n, p in self._shared if not p.requires_grad], None
        if self._tensors is None:  # once per fit (setup makes a new average) and per unfreezing: the same tensors
            self._tensors = self._pairs(pl_module)
        (averages, currents), copied = self._tensors
        if averages and not first:
            get_ema_multi_avg_fn(decay)(averages, currents, None)  # torch's: one fused lerp per device and dtype
        if first:  # the first update: the weights themselves
            for a, c in zip(averages, currents, strict=True):
                a.copy_(c)
        for a, c in copied:  # integer buffers (BatchNorm's batch counter): the current value
            a.copy_(c)
        self._average_model.n_averaged += 1  # on the device: no host read

    def _pairs(self, pl_module: L.LightningModule) -> _Tensors:
        """(the average's floating tensors, the task's), then (average, task) for each integer buffer; a tensor the
        two share is in neither. The tensors themselves (not detached views): they follow a later `.data` swap."""
        assert self._average_model is not None
        average = self._average_model.module
        pairs = [(a, c) for a, c in zip(itertools.chain(average.parameters(), average.buffers()),
                 itertools.chain(pl_module.parameters(), pl_module.buffers()), strict=True) if a is not c]  # fmt: skip
        floats = [(a, c) for a, c in pairs if a.is_floating_point()]
        ints = [(a, c) for a, c in pairs if not a.is_floating_point()]
        return ([a for a, _ in floats], [c for _, c in floats]), ints

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        # Only a resumed fit trains on the raw weights again; test, validate and predict of a checkpoint evaluate its
        # state_dict, the average (Lightning's would put the raw weights back when fit's own test reloads best.ckpt).
        if trainer.state.fn == TrainerFn.FITTING and self._average_model is not None:
            super().on_load_checkpoint(trainer, pl_module, checkpoint)


class _SharingFrozen:
    """What ``AveragedModel`` deep-copies: the task, but for the parameters that need no gradient, which the copy
    shares (a frozen base may be most of the memory)."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def __deepcopy__(self, memo: dict[int, Any]) -> nn.Module:
        frozen = {id(p): p for p in self.module.parameters() if not p.requires_grad}
        return copy.deepcopy(self.module, {**memo, **frozen})
