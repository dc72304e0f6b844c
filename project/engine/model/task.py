"""The base of every task: the engine around any ``net``, its hooks calling the engine's files by name.

A task (``project/tasks/``) subclasses ``Task`` and says what the problem is: what ``TaskContract``
(``task_contract.py``) lists, its loss, metrics and predictions. ``Task`` adds the constructor the config fills (the
net, the optimizer, the schedule, fine-tuning), the training and evaluation steps, the token-weighted loss scaling,
and the checkpoint's extras.
"""

import os
from typing import Any

import lightning as L
import torch
from lightning.pytorch.core.mixins.hparams_mixin import _given_hyperparameters
from torch import Tensor, nn
from torchmetrics import MeanMetric, MetricCollection

from project.engine.checkpointing import checkpoint_io, rng
from project.engine.data import batches
from project.engine.data.datamodule import DataModule
from project.engine.model import accumulation, finetuning, monitored, parts, sharding
from project.engine.model.accumulation import is_logging_step
from project.engine.model.metrics import IGNORE_INDEX as IGNORE_INDEX  # a task's padding target, importable from here
from project.engine.model.metrics import EvaluatedLoss, summed_over_tokens, update_mean_loss
from project.engine.model.optimization import (
    OptimizerCallable,
    ParamGroupsCallable,
    ScheduleCallable,
    WarmupSchedule,
    build_optimizer,
    check_warmup,
    optimizer_groups,
    planned_run,
    refuse_accumulation_across_closure_calls,
)
from project.engine.model.task_contract import PROMISES as PROMISES  # importable from here
from project.engine.model.task_contract import Batch, TaskContract


class Task(TaskContract, L.LightningModule):
    """A problem around any ``net``: what a subclass declares is ``TaskContract``'s; the steps may be overridden."""

    def __init__(
        self,
        net: nn.Module,
        target_names: list[str] | None = None,
        optimizer: OptimizerCallable = torch.optim.AdamW,
        optimizers: dict[str, OptimizerCallable] | None = None,
        warmup: int | float = 0.05,
        schedule: ScheduleCallable = WarmupSchedule,
        param_groups: ParamGroupsCallable | None = None,
        compile: bool | str = False,
        init_from: str | None = None,
        freeze_backbone: bool | int = False,
        backbone_lr_scale: float = 1.0,
        monitor: str | None = None,
    ) -> None:
        """
        Args:
            net: the network, any ``nn.Module`` mapping a batch of inputs to the task's outputs.
            target_names: the names of the targets (classes, or value columns), linked from the DataModule.
            optimizer: any ``torch.optim`` optimizer by class path, with its own arguments (``lr``: the peak).
            optimizers: for a task that steps several (manual optimization: a GAN), one per part of the net, each the
                net's submodule of that name, with the recipe's parameter groups and a schedule of its own (instead of
                ``optimizer``). ``manual_step`` steps one; the run's step count is the first one's steps.
            warmup: linear warmup: an int is a number of optimizer steps, a float in [0, 1) a fraction of the run's.
            schedule: the LR schedule per optimizer step (``project/recipe.py``: ``WarmupCosine``, ``WarmupLinear``,
                ``WarmupConstant``, ``WarmupStableDecay``), or a class built as ``cls(optimizer, total, warmup)``;
                by default the engine's ``WarmupSchedule``: the warmup, then the optimizer's lr to the end.
            param_groups: which parameters decay: a function of the (name, parameter) pairs to train that returns
                torch's parameter groups (``project.recipe.param_groups``: weight matrices only); None: one group.
            compile: ``torch.compile`` the net in place (true: inductor; a string names another backend).
            init_from: a fresh run starts from an earlier run's weights (its directory, a checkpoint or a weights
                file): the tensors whose names and shapes match; the rest (a head for other classes) stays new.
            freeze_backbone: the net's ``backbone`` submodule is not trained: true for the whole run, N for the first
                N epochs (its BatchNorm statistics kept).
            backbone_lr_scale: the backbone's learning rate relative to the head's, e.g. 0.1.
            monitor: the metric this run is judged by, one the task logs (e.g. ``val/auroc``), in its own direction;
                None: the task's.
        """
        super().__init__()
        check_warmup(warmup)
        finetuning.check_finetuning(net, freeze_backbone, backbone_lr_scale)
        # From the CLI the hparams are plain config (weights_only loads); by hand net, optimizer, schedule are objects.
        # Private: no public way to ask (Lightning #20726, #20432); the weights-only checkpoint tests fail without it.
        self.save_hyperparameters(
            ignore=None
            if _given_hyperparameters.get()
            else ["net", "optimizer", "optimizers", "schedule", "param_groups"]
        )
        self.net = net
        self.optimizer, self.optimizers_of_parts, self.schedule = optimizer, optimizers, schedule
        self.param_groups = param_groups
        # Under manual optimization the task clips (Lightning refuses the Trainer's flag): the CLI hands it over.
        self.gradient_clipping: tuple[float | None, str | None] = (None, None)
        self.target_names = list(target_names or [])
        # No NaN check (a host sync per update): the DivergenceGuard callback watches the loss without one.
        self.train_loss = MeanMetric(nan_strategy="disable")
        self.val_loss, self.test_loss = EvaluatedLoss(), EvaluatedLoss()
        metrics = self.configure_metrics()
        self.val_metrics = metrics.clone(prefix="val/")
        self.test_metrics = metrics.clone(prefix="test/")
        if monitor is not None:
            self.monitor, self.mode = monitored.monitor_and_mode(type(self).__name__, metrics, monitor)
        self._window_tokens: Tensor | None = None  # counted tokens of this process's micro-batches in the window

    # ---- the engine ---------------------------------------------------------------------------------------------

    def configure_model(self) -> None:
        if self.device_mesh is not None and not getattr(self, "_sharded", False):  # FSDP2
            sharding.shard(self.net, self.device_mesh["data_parallel"], str(self.trainer.precision))
            self._sharded = True
        compile = self.hparams["compile"]
        if compile and not getattr(self, "_compiled", False):
            self.net.compile(**({} if compile is True else {"backend": compile}))
            self._compiled = True

    def forward(self, inputs: Any) -> Any:
        return batches.call(self.net, inputs)  # several named inputs as keyword arguments

    def setup(self, stage: str) -> None:
        # Set by Lightning, it makes torch's CUDA build dlopen NVML every optimizer step of a CPU run: none needs it.
        if self.trainer.strategy.root_device.type == "cpu":
            os.environ.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)
        # One validation input: Lightning's summary forwards it to count FLOPs (else 0); a compiled net would recompile.
        data: Any = getattr(self.trainer, "datamodule", None)
        engine_hook = getattr(type(data), "on_after_batch_transfer", None) is DataModule.on_after_batch_transfer
        if stage == "fit" and engine_hook and not self.hparams.get("compile"):  # yours may unpack (inputs, targets)
            inputs = data.split_tensors("val", 1)[0]  # a batch of one; named inputs wrapped: the summary would spread
            inputs = inputs if isinstance(inputs, Tensor) else (inputs,)  # a dict as keyword arguments
            self.example_input_array = self.trainer.precision_plugin.convert_input(inputs)

    def on_fit_start(self) -> None:
        if not self.automatic_optimization:
            parts.count_each_batch_once(self.trainer)
        # A fresh run only: a resumed one has restored its weights, and what it started from may be gone.
        if self.trainer.ckpt_path is None:
            init_from = self.hparams.get("init_from")
            self.initialized_from = finetuning.load_initial_weights(self.net, init_from, self.target_names)

    def on_train_epoch_start(self) -> None:
        # From the epoch alone, so a resumed run freezes as the uninterrupted one. Frozen parameters get no gradient,
        # so the optimizer skips them (no update, no decay, no state) until they start training as if new to it.
        if self.hparams.get("freeze_backbone", False):
            self._frozen = finetuning.frozen_in(self.hparams["freeze_backbone"], self.current_epoch)
            finetuning.backbone_of(self.net).requires_grad_(not self._frozen)
            self.train(self.training)

    def train(self, mode: bool = True) -> "Task":
        super().train(mode)
        if mode and getattr(self, "_frozen", False):
            finetuning.keep_batchnorm_frozen(finetuning.backbone_of(self.net))
        return self

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        x, y = self.split_batch(batch)
        losses = self.loss(self(x), y)
        if self.counted == "tokens":
            # The sum, not the mean: the backward hook divides the whole step's gradient by its token count.
            loss, tokens = summed_over_tokens(losses, y)
            self._window_tokens = tokens if self._window_tokens is None else self._window_tokens + tokens
            shown = loss.detach() / tokens.clamp_min(1)
        else:
            loss = shown = losses.mean()
        # Only on the steps the logger writes: each self.log costs ~0.8 ms on a CPU.
        if is_logging_step(self.trainer):
            self.train_loss(shown.detach())
            self.log("train/loss", self.train_loss, on_step=True, on_epoch=False)
        return loss

    def backward(self, loss: Tensor, *args: Any, **kwargs: Any) -> None:
        # The step's loss scaling (accumulation.py), here, not in training_step: it holds whatever a task computes.
        if self.counted == "tokens" and self._window_tokens is not None:
            if accumulation.is_last_micro_batch(self.trainer):
                loss = loss * accumulation.token_weighting(self.trainer, self, self._window_tokens).to(loss.dtype)
                self._window_tokens = None
        elif (correction := accumulation.tail_window_correction(self.trainer)) != 1.0:
            loss = loss * correction
        super().backward(loss, *args, **kwargs)

    def _evaluate(self, batch: Batch, loss_metric: EvaluatedLoss, metrics: MetricCollection) -> dict[str, Tensor]:
        x, y = self.split_batch(batch)
        outputs = self(x)
        update_mean_loss(loss_metric, self.loss(outputs, y), y, self.counted)
        self.update_metrics(metrics, outputs, y)
        # A callback's on_validation_batch_end's ``outputs``: it needs no second forward pass (project/callbacks.py).
        return {"outputs": outputs, "targets": y}

    def log_epoch(self, stage: str, loss_metric: EvaluatedLoss, metrics: MetricCollection) -> None:
        """The stage's loss, its standard error and metrics, once per epoch (Lightning syncs and resets them); a task
        adds its own here."""
        loss_metric.compute()  # synced over the processes, once (Lightning's compute of it reads this result)
        self.log(f"{stage}/loss", loss_metric, prog_bar=self.monitor == f"{stage}/loss")
        # The same on every process (from the summed states): averaging it over them (sync_dist) changes nothing and
        # spares Lightning's warning that an epoch-level value is not synced.
        self.log(f"{stage}/loss_se", loss_metric.standard_error, sync_dist=True)
        for name, metric in metrics.items(keep_base=False):
            self.log(name, metric, prog_bar=name == self.monitor)

    def validation_step(self, batch: Batch, batch_idx: int) -> dict[str, Tensor]:
        return self._evaluate(batch, self.val_loss, self.val_metrics)

    def on_validation_epoch_end(self) -> None:
        self.log_epoch("val", self.val_loss, self.val_metrics)

    def test_step(self, batch: Batch, batch_idx: int) -> dict[str, Tensor]:
        return self._evaluate(batch, self.test_loss, self.test_metrics)

    def on_test_epoch_end(self) -> None:
        self.log_epoch("test", self.test_loss, self.test_metrics)

    def predict_step(self, batch: Batch, batch_idx: int) -> Tensor:
        return self.prediction(self(self.split_batch(batch)[0]))

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["rng_states"] = rng.capture_rng_state()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Before the weights are loaded (FSDP loads its own: no state_dict here): another architecture gets a sentence.
        checkpoint_io.check_fits(self.state_dict(), checkpoint.get("state_dict", {}))
        # Lightning loads weights before its precision plugin converts the module: 64-true would round via float32.
        if self._trainer is not None:
            self.trainer.precision_plugin.convert_module(self)
        # Only when training resumes: loading weights for test/predict leaves the global RNG alone.
        if self._trainer is not None and self.trainer.state.fn == "fit" and "rng_states" in checkpoint:
            rng.restore_rng_state(checkpoint["rng_states"])

    def manual_step(self, part: str, loss: Tensor) -> None:
        """Manual optimization with ``optimizers``: ``loss`` back-propagated into the net's ``part`` alone (the other
        parts' gradients kept off), clipped as the config's ``trainer.gradient_clip_val`` says, then that part's
        optimizer and schedule step. A batch counts once toward the run's steps (``max_steps``, the schedules'
        length, logging, ``val_check_interval``), whichever parts step in it."""
        parts.step(self, part, loss)

    def configure_optimizers(self) -> Any:
        if self.optimizers_of_parts:
            return parts.configure(self, self.optimizers_of_parts)
        # The config's recipe; a fine-tuned backbone has groups of its own all run long (frozen: no gradients).
        backbone, scale = finetuning.finetuned_backbone(self), self.hparams["backbone_lr_scale"]
        optimizer = build_optimizer(self.optimizer, optimizer_groups(self, self.param_groups, backbone, scale))
        refuse_accumulation_across_closure_calls(optimizer, self.trainer.accumulate_grad_batches)
        total, warmup = planned_run(self.trainer, self.hparams["warmup"])
        scheduler = self.schedule(optimizer, total, warmup)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 1}}
