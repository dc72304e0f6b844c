"""The base of every task: the mechanics of training a ``net`` that are not the recipe.

A task (``project/tasks/``) subclasses ``Task`` and says only what the problem is:

- ``monitor`` and ``mode``: the metric it is judged by and its direction (``"val/acc"``, ``"max"``); the best
  checkpoint, early stopping, ``make runs`` and ``make sweep`` read them unless the config names another;
- ``target_kind``: the targets it learns from, as the DataModule declares them (``"classes"`` or ``"values"``);
- ``counted``: what its loss averages over: ``"samples"`` (a loss per sample) or ``"tokens"`` (a loss per
  sequence position; a target equal to ``IGNORE_INDEX`` is padding and counts for nothing). Token losses are
  weighted by token over the whole optimizer step: the sum of the step's per-token losses, over every micro-batch
  of the accumulation window and every process, divided by the step's count of counted tokens (Lightning #20350);
- ``class_dim``: where a class-scored output keeps its classes (1: (batch, classes, ...) as a segmentation's;
  -1: (batch, positions, vocabulary) as a language model's);
- ``loss(outputs, targets)``: the loss per sample or per token (unreduced: training takes its mean as ``counted``
  says, evaluation its exact mean over the whole split);
- ``configure_metrics()``: a torchmetrics ``MetricCollection``, cloned per stage and logged as ``val/<name>`` and
  ``test/<name>`` once per epoch (``update_metrics`` feeds it, from the net's outputs by default);
- what a prediction is: ``prediction(outputs)`` (e.g. probabilities, or values in the targets' units),
  ``prediction_table(predictions)`` (the prediction file's columns) with ``write_prediction_files`` (files beside
  it, if a prediction has any: e.g. mask images), and for export ``output_head()`` (what follows
  the net in the exported model) with ``output_description()`` (its name, shape and meaning in ``model.json``);
  ``settable_at_predict``: the constructor arguments that say how to predict, not what was trained (a language
  model's ``max_new_tokens``, ``temperature``...): ``predict`` may change them on a checkpoint.

The engine here owns the rest, whatever the task's steps compute: the configured optimizer over the weight-decay
split and the configured schedule per optimizer step (``project/recipe.py``), the accumulation tail-window correction
and the token weighting of a step (in the ``backward`` hook), the logging-step gating and the gradient-norm log, the
RNG state in checkpoints, the checkpoint fit check, ``torch.compile``, the FSDP sharding hook, the fast_dev_run warmup
squeeze, and a validation at the last step of a run that ends at ``trainer.max_steps`` mid-epoch.
"""

import math
import os
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.core.mixins.hparams_mixin import _given_hyperparameters
from torch import Tensor, nn
from torch.distributed.tensor import DTensor
from torchmetrics import MeanMetric, MetricCollection

from project.engine.errors import ConfigError
from project.engine.rng import capture_rng_state, restore_rng_state
from project.engine.weights import load_matching, read_weights, resolve_weights_file
from project.recipe import (
    OptimizerCallable,
    ScheduleCallable,
    WarmupCosine,
    build_optimizer,
    check_warmup,
    param_groups,
    resolve_warmup_steps,
)

Batch = tuple[Tensor, Tensor]
# A target that counts for nothing (padding): torch's cross_entropy skips it by default, as Hugging Face's labels do.
# A batch is always (inputs, targets): the targets say which positions count, and a net that must know where the
# inputs are padded reads it from the inputs (its pad id), so an exported model keeps one input.
IGNORE_INDEX = -100


class WeightedMean(MeanMetric):
    """torchmetrics' ``MeanMetric`` with its weights kept: with ``nan_strategy="disable"`` (no NaN check, which
    costs a host sync per update) it replaces every weight by 1 (torchmetrics #3434), so a token-weighted mean
    would silently count padding."""

    def __init__(self) -> None:
        super().__init__(nan_strategy="disable")

    def update(self, value: Tensor, weight: Tensor | None = None) -> None:  # type: ignore[override]
        if weight is None:
            super().update(value)
            return
        self.mean_value += (value * weight).sum().to(self.mean_value.dtype)
        self.weight += weight.sum().to(self.weight.dtype)


class Task(L.LightningModule):
    """The config's optimizer and LR schedule, stepped per optimizer step, around any ``net``. Subclass it (see the
    module docstring for what a task declares); ``training_step`` and the evaluation steps may be overridden too,
    and the engine's mechanics still apply."""

    monitor: str = "val/loss"
    mode: Literal["min", "max"] = "min"
    target_kind: Literal["classes", "values"] = "classes"
    counted: Literal["samples", "tokens"] = "samples"
    class_dim: int = 1
    settable_at_predict: tuple[str, ...] = ()

    def __init__(
        self,
        net: nn.Module,
        target_names: list[str] | None = None,
        optimizer: OptimizerCallable = torch.optim.AdamW,
        warmup: int | float = 0.05,
        schedule: ScheduleCallable = WarmupCosine,
        compile: bool | str = False,
        init_from: str | None = None,
        freeze_backbone: bool | int = False,
        backbone_lr_scale: float = 1.0,
        monitor: str | None = None,
    ) -> None:
        """
        Args:
            net: the network, any ``nn.Module`` mapping a batch of inputs to the task's outputs.
            target_names: the names of the targets (class names, or the value columns), linked from the DataModule
                by the CLI.
            optimizer: any ``torch.optim`` optimizer by class path, with its own arguments; its ``lr`` is the peak
                learning rate, its ``weight_decay`` applies to weight matrices and conv kernels only
                (``project/recipe.py``).
            warmup: linear-warmup length: an int is a number of optimizer steps, a float in [0, 1) a fraction
                of the run's optimizer steps.
            schedule: the LR schedule, stepped per optimizer step: ``project.recipe.WarmupCosine`` (the default),
                ``WarmupLinear``, ``WarmupConstant``, ``WarmupStableDecay``, or a class of yours built as
                ``cls(optimizer, total_steps, warmup_steps, **init_args)``.
            compile: ``torch.compile`` the net (true: the default inductor backend; a string names another
                backend, e.g. "eager" to debug). Compiled in place (``nn.Module.compile``), so parameter names and
                checkpoints are those of the plain net and load into an uncompiled model.
            init_from: start a fresh run (new optimizer, schedule and run directory) from the weights of an earlier
                run (its directory: best.ckpt, else last.ckpt), a checkpoint, or a weights file: the tensors whose
                names and shapes match are loaded, the rest (e.g. a head for other classes) stays new. Loaded after
                the net's own pretrained weights, if any; ignored when a run resumes (its checkpoint has the weights).
            freeze_backbone: the net's ``backbone`` (a net declares it by having that submodule) is not trained:
                true for the whole run, N for the first N epochs. While frozen its BatchNorm layers stay in eval mode
                (their running statistics are kept).
            backbone_lr_scale: the backbone's learning rate relative to the head's (the whole schedule's curve
                scaled), e.g. 0.1 to fine-tune pretrained features gently.
            monitor: the metric this run is judged by (best checkpoint, early stopping, ``make runs``, ``make
                sweep``), one the task logs, e.g. ``val/auroc``; its direction is the metric's own
                (torchmetrics' ``higher_is_better``; ``val/loss``: min). None: the task's (``monitor``, ``mode``).
        """
        super().__init__()
        check_warmup(warmup)
        if not (isinstance(freeze_backbone, bool) or freeze_backbone >= 0):
            raise ConfigError(f"model.freeze_backbone={freeze_backbone!r}: true, false, or a number of epochs >= 0.")
        if not backbone_lr_scale > 0:
            raise ConfigError(f"model.backbone_lr_scale={backbone_lr_scale!r}: must be > 0 (freeze it instead: "
                              "model.freeze_backbone=true).")  # fmt: skip
        if (freeze_backbone or backbone_lr_scale != 1.0) and not isinstance(getattr(net, "backbone", None), nn.Module):
            raise ConfigError(
                f"model.freeze_backbone={freeze_backbone!r}, model.backbone_lr_scale={backbone_lr_scale!r}: "
                f"{type(net).__name__} declares no backbone: a net to fine-tune names its pretrained part "
                "self.backbone (a submodule) and the rest, trained from the start, anything else."
            )
        # Under LightningCLI the saved hparams are the config, ``net`` as class_path/init_args: plain data that
        # loads with weights_only=True and lets load_from_checkpoint rebuild the net. Built by hand, ``net`` is a
        # module object, which must never be pickled into a checkpoint: its weights are in the state_dict anyway.
        # Private: Lightning exposes "hparams came from the CLI" only through this context variable (Lightning
        # #20726, #20432); the weights-only checkpoint tests fail if it changes. (Collects the subclass's own
        # arguments too: Lightning walks the chain of __init__ frames.)
        # The optimizer and schedule likewise: the CLI's config names their classes; by hand they are callables.
        self.save_hyperparameters(ignore=None if _given_hyperparameters.get() else ["net", "optimizer", "schedule"])
        self.net = net
        self.optimizer, self.schedule = optimizer, schedule
        self.target_names = list(target_names or [])
        # nan_strategy="disable": the default NaN check costs a host sync per update; a NaN loss should show
        # in the curve anyway (and EarlyStopping stops on it).
        self.train_loss = MeanMetric(nan_strategy="disable")
        self.val_loss, self.test_loss = WeightedMean(), WeightedMean()
        metrics = self.configure_metrics()
        self.val_metrics = metrics.clone(prefix="val/")
        self.test_metrics = metrics.clone(prefix="test/")
        if monitor is not None:
            directions = {"val/loss": False, **{f"val/{k}": m.higher_is_better for k, m in metrics.items()}}
            if directions.get(monitor) is None:
                raise ConfigError(
                    f"model.monitor={monitor!r}: {type(self).__name__} logs {', '.join(sorted(directions))} (a metric "
                    "of unknown direction cannot judge a run); choose one of them, or add the metric to the task."
                )
            self.monitor, self.mode = monitor, "max" if directions[monitor] else "min"
        self.initialized_from: dict[str, Any] = {}  # where a fresh run's weights came from, for provenance.json
        self._window_tokens: Tensor | None = None  # counted tokens of this process's micro-batches in the window

    # ---- what a task says ---------------------------------------------------------------------------------------

    def loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        """The loss of each sample (or pixel), unreduced."""
        raise NotImplementedError(f"{type(self).__name__} must implement loss(outputs, targets).")

    def configure_metrics(self) -> MetricCollection:
        """The metrics logged per evaluation stage, e.g. ``MetricCollection({"acc": MulticlassAccuracy(...)})``."""
        return MetricCollection({})

    def update_metrics(self, metrics: MetricCollection, outputs: Tensor, targets: Tensor) -> None:
        metrics.update(outputs, targets)

    def prediction(self, outputs: Tensor) -> Tensor:
        """What ``predict`` returns for the net's outputs (one row per sample)."""
        return outputs

    def prediction_table(self, predictions: Tensor) -> tuple[list[str], list[list[Any]]]:
        """The prediction file's header and one row per sample (the writer adds ``index`` and ``input``)."""
        header = [f"output_{i}" for i in range(predictions[0].numel())]
        return header, [[f"{v:.6g}" for v in row] for row in predictions.flatten(1).tolist()]

    def write_prediction_files(self, predictions: Tensor, folder: Path, datamodule: Any) -> None:
        """Files a prediction has beside its row (e.g. a segmentation's mask images), written into ``folder``, the
        prediction file's, and named in ``prediction_table``'s rows; none by default. ``datamodule`` is the one
        that decoded the inputs (what it kept of them, e.g. their names and sizes)."""

    def output_head(self) -> nn.Module:
        """What follows the net in the exported model (the outputs ``output_description`` describes)."""
        return nn.Identity()

    def output_description(self) -> dict[str, Any]:
        """``model.json``'s "output": the exported model's output name, shape and meaning."""
        return {"name": "outputs", "shape": ["batch", len(self.target_names)], "targets": self.target_names}

    # ---- the engine ---------------------------------------------------------------------------------------------

    def configure_model(self) -> None:
        # FSDP2 (configs/fsdp.yaml: ModelParallelStrategy provides the device mesh): shard each unit, then the
        # whole net, over the data-parallel dimension. Before the optimizer is built.
        if self.device_mesh is not None and not getattr(self, "_sharded", False):
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            mesh = self.device_mesh["data_parallel"]
            policy = MixedPrecisionPolicy()  # FSDP's default: compute in the weights' own dtype
            if str(self.trainer.precision).startswith("bf16"):
                # The gathered weights compute in bfloat16 (half the all-gather), gradients are reduced in float32
                # and the shards stay float32 (torchtitan's policy).
                policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            # The net may name its units (a transformer's blocks); else every layer with weights is one.
            units = getattr(self.net, "shard_units", None)
            for layer in units() if units else (m for m in self.net.modules() if isinstance(m, nn.Linear | nn.Conv2d)):
                fully_shard(layer, mesh=mesh, mp_policy=policy)
            fully_shard(self.net, mesh=mesh, mp_policy=policy)
            self._sharded = True
        compile = self.hparams["compile"]
        if compile and not getattr(self, "_compiled", False):
            self.net.compile(**({} if compile is True else {"backend": compile}))
            self._compiled = True

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def setup(self, stage: str) -> None:
        # Lightning sets PYTORCH_NVML_BASED_CUDA_CHECK=1 (fork-safe CUDA checks), under which torch asks NVML anew on
        # every torch.cuda.is_available() until CUDA is initialised, and AdamW asks at every step (its graph-capture
        # check): a run on the CPU with the CUDA build of torch (what pip installs on Linux) paid a dlopen of
        # libnvidia-ml per step. A run that never initialises CUDA has no fork to keep CUDA-safe.
        if self.trainer.strategy.root_device.type == "cpu":
            os.environ.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)

    def on_fit_start(self) -> None:
        # A fresh run only: a resumed one has its weights (and the fine-tuned backbone) in its checkpoint, already
        # restored by now, and the files it started from need not exist any more.
        if self.trainer.ckpt_path is not None:
            return
        load_pretrained = getattr(self.net, "load_pretrained", None)
        if callable(load_pretrained) and (pretrained := load_pretrained()):
            self.initialized_from["pretrained"] = pretrained
        if self.hparams.get("init_from"):
            key = "model.init_from"
            path = resolve_weights_file(self.hparams["init_from"], key)
            (state, theirs), why_new = read_weights(path, key), ""
            # A head trained for other classes (even as many) would start out wrong with confidence: where the net
            # declares its backbone, only that is taken from a run of other targets.
            if theirs is not None and theirs != self.target_names and hasattr(self.net, "backbone"):
                state = {k: v for k, v in state.items() if k.startswith("backbone.")}
                why_new = f"the earlier run's targets were {theirs[:4]}, not {self.target_names[:4]}"
            loaded = load_matching(self.net, state, str(path), key, why_new=why_new)
            self.initialized_from["init_from"] = loaded.record()

    def _backbone(self) -> nn.Module:
        backbone = self.net.backbone  # declared by the net (checked in __init__)
        assert isinstance(backbone, nn.Module)
        return backbone

    def backbone_frozen(self, epoch: int) -> bool:
        """Whether ``model.freeze_backbone`` freezes the backbone during ``epoch`` (0-based)."""
        freeze = self.hparams.get("freeze_backbone", False)
        return freeze is True or (freeze is not False and epoch < freeze)

    def on_train_epoch_start(self) -> None:
        # Decided from the epoch alone, so a run resumed in any epoch freezes exactly as the uninterrupted one.
        # Frozen parameters get no gradient, so AdamW skips them entirely (no update, no weight decay, no state):
        # at the unfreeze epoch they start training as if new to the optimizer, whose groups never change.
        if self.hparams.get("freeze_backbone", False):
            self._frozen = self.backbone_frozen(self.current_epoch)
            self._backbone().requires_grad_(not self._frozen)
            self.train(self.training)

    def train(self, mode: bool = True) -> "Task":
        super().train(mode)
        # Lightning puts the model back in train mode after validation: a frozen backbone's BatchNorm must stay in
        # eval mode, or its running statistics would drift with the new data while its weights stay fixed.
        if mode and getattr(self, "_frozen", False):
            for module in self._backbone().modules():
                if isinstance(module, nn.modules.batchnorm._BatchNorm):
                    module.eval()
        return self

    def training_step(self, batch: Batch, batch_idx: int) -> Tensor:
        x, y = batch
        losses = self.loss(self(x), y)
        if self.counted == "tokens":
            # The sum, not the mean: the backward hook divides the whole step's gradient by its token count.
            counted = y != IGNORE_INDEX
            tokens = counted.sum()
            self._window_tokens = tokens if self._window_tokens is None else self._window_tokens + tokens
            loss = losses.masked_fill(~counted, 0.0).sum()
            shown = loss.detach() / tokens.clamp_min(1)
        else:
            loss = shown = losses.mean()
        # Only on the steps the logger writes: each self.log of a metric costs ~0.8 ms of Lightning bookkeeping
        # on a CPU (it moves the metric "to the device" every call), more than a small model's whole step.
        if self.is_logging_step():
            self.train_loss(shown.detach())
            self.log("train/loss", self.train_loss, on_step=True, on_epoch=False)
        return loss

    def is_logging_step(self) -> bool:
        """Whether the optimizer step under way is one the logger writes: ``global_step + 1`` is that step's
        number, as Lightning's ``should_update_logs`` counts before the step."""
        every = self.trainer.log_every_n_steps  # type: ignore[attr-defined]
        return every > 0 and (self.trainer.global_step + 1) % every == 0

    def backward(self, loss: Tensor, *args: Any, **kwargs: Any) -> None:
        # Here rather than in training_step, so it holds whatever a task's training_step computes.
        if self.counted == "tokens" and self._window_tokens is not None:
            scale = self._token_weighting()
            if scale is not None:
                loss = loss * scale.to(loss.dtype)
        elif (correction := self._tail_window_correction()) != 1.0:
            loss = loss * correction
        super().backward(loss, *args, **kwargs)

    def _token_weighting(self) -> Tensor | None:
        """At the last micro-batch of an optimizer step, the factor that turns the step's gradient into that of the
        sum of its per-token losses divided by its count of counted tokens, over every micro-batch and process:
        Lightning divides each micro-batch's loss by ``accumulate_grad_batches`` (k, also in a short last window)
        and DDP averages over the W processes, so the factor is k * W / tokens. The gradients accumulated so far
        are scaled here, and the last micro-batch's loss by the caller, before DDP's reduction and before any
        ``on_before_optimizer_step`` hook (clipping, the grad-norm log, callbacks) sees them. None mid-window."""
        # Private: Lightning has no public way to ask whether this micro-batch ends its window; its own rule is this
        # (Lightning #19987, #21808). The accumulation and token tests fail if it changes.
        if self.trainer.fit_loop.epoch_loop._should_accumulate():
            return None
        assert self._window_tokens is not None
        tokens = self.trainer.strategy.reduce(self._window_tokens, reduce_op="sum")  # one collective per step
        self._window_tokens = None
        scale = self.trainer.accumulate_grad_batches * self.trainer.world_size / tokens.clamp_min(1).double()
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        if grads:
            torch._foreach_mul_(grads, scale.to(grads[0].dtype))
        return scale

    def _tail_window_correction(self) -> float:
        """Lightning divides every micro-batch loss by ``accumulate_grad_batches`` (k), also in an epoch's last
        window when it holds only r < k micro-batches, whose step then gets r/k of its gradient (Lightning
        #19987). Scaling those losses by k/r makes that step the mean over its r micro-batches, as a big batch."""
        k = self.trainer.accumulate_grad_batches
        n = self.trainer.num_training_batches
        if k == 1 or not math.isfinite(n):
            return 1.0
        batch_idx = self.trainer.fit_loop.epoch_loop.batch_idx
        window = min(k, int(n) - batch_idx // k * k)
        return k / window

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        # Called once per optimizer step, after accumulation and AMP unscaling, before clipping: the true pre-clip
        # norm. Computed on device (one fused reduction, no host copy per parameter), on logging steps only.
        if self.is_logging_step():
            grads = [p.grad for p in self.parameters() if p.grad is not None]
            norm = torch.nn.utils.get_total_norm(grads)
            if isinstance(norm, DTensor):  # sharded gradients (FSDP): the norm over all shards
                norm = norm.full_tensor()
            self.log("train/grad_norm", norm, on_step=True, on_epoch=False)

    def _evaluate(self, batch: Batch, loss_metric: MeanMetric, metrics: MetricCollection) -> dict[str, Tensor]:
        x, y = batch
        outputs = self(x)
        # Per-sample (per-token) losses into a MeanMetric: the epoch value is the exact mean over samples (counted
        # tokens), also across DDP ranks with uneven shards (a mean of batch means, or sync_dist on a tensor, would
        # not be).
        losses = self.loss(outputs, y)
        if self.counted == "tokens":
            counted = y != IGNORE_INDEX
            loss_metric.update(losses.masked_fill(~counted, 0.0), weight=counted.to(losses.dtype))
        else:
            loss_metric.update(losses)
        self.update_metrics(metrics, outputs, y)
        # What a callback's on_validation_batch_end / on_test_batch_end receives as ``outputs``: the net's outputs
        # and the targets of the batch, so a callback of yours (project/callbacks.py) needs no second forward pass.
        return {"outputs": outputs, "targets": y}

    def _log_epoch(self, stage: str, loss_metric: MeanMetric, metrics: MetricCollection) -> None:
        # Once per epoch, not per batch: the same value (Lightning computes, syncs across ranks and resets the
        # metric objects at epoch end) without Lightning's per-call bookkeeping (~0.8 ms a call) on every batch.
        self.log(f"{stage}/loss", loss_metric, prog_bar=self.monitor == f"{stage}/loss")
        for name, metric in metrics.items(keep_base=False):
            self.log(name, metric, prog_bar=name == self.monitor)

    def validation_step(self, batch: Batch, batch_idx: int) -> dict[str, Tensor]:
        return self._evaluate(batch, self.val_loss, self.val_metrics)

    def on_validation_epoch_end(self) -> None:
        self._log_epoch("val", self.val_loss, self.val_metrics)

    def test_step(self, batch: Batch, batch_idx: int) -> dict[str, Tensor]:
        return self._evaluate(batch, self.test_loss, self.test_metrics)

    def on_test_epoch_end(self) -> None:
        self._log_epoch("test", self.test_loss, self.test_metrics)

    def predict_step(self, batch: Batch, batch_idx: int) -> Tensor:
        return self.prediction(self(batch[0]))

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["rng_states"] = capture_rng_state()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Called before the weights are loaded: a checkpoint of another architecture gets one clear sentence.
        own, theirs = self.state_dict(), checkpoint.get("state_dict", {})  # FSDP loads the weights itself
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
        # Lightning restores the weights before its precision plugin converts the module (strategy.setup): a
        # 64-true checkpoint would be rounded through float32 on the way in. Convert first (idempotent).
        if self._trainer is not None:
            self.trainer.precision_plugin.convert_module(self)
        # Only when training resumes: loading weights for test/predict leaves the global RNG alone.
        if self._trainer is not None and self.trainer.state.fn == "fit" and "rng_states" in checkpoint:
            restore_rng_state(checkpoint["rng_states"])

    def configure_optimizers(self) -> Any:
        # The recipe (project/recipe.py): the optimizer over the weight-decay split (a backbone being fine-tuned in
        # groups of its own, the same all run long: freezing only withholds gradients), and the schedule over the
        # run's optimizer steps, stepped per optimizer step.
        finetuned = self.hparams.get("freeze_backbone", False) or self.hparams.get("backbone_lr_scale", 1.0) != 1.0
        backbone = self._backbone() if finetuned else None
        optimizer = build_optimizer(self.optimizer, param_groups(self, backbone, self.hparams["backbone_lr_scale"]))
        total = self.trainer.estimated_stepping_batches
        if not math.isfinite(total):
            raise ConfigError(
                "The run length is unknown (infinite data and no trainer.max_steps); set trainer.max_steps so the "
                "LR schedule knows where it ends."
            )
        total = int(total)
        warmup = resolve_warmup_steps(self.hparams["warmup"], total)
        if getattr(self.trainer, "fast_dev_run", False):  # a smoke test of a few batches: the curve squeezed in
            warmup = min(warmup, total - 1)
        scheduler = self.schedule(optimizer, total, warmup)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 1}}
