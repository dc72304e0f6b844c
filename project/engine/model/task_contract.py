"""What a task says it is, which the engine and everything downstream read: the class attributes below, its loss,
its metrics, how a batch splits, what a prediction is and what follows the net in the exported model. A task
(``project/tasks/``) subclasses ``project.engine.model.task.Task``, which is this contract and the engine around it;
each method here has the default a task keeps unless it says otherwise.
"""

from pathlib import Path
from typing import Any, Literal

from torch import Tensor, nn
from torchmetrics import MetricCollection

Batch = Any  # whatever the DataModule yields: (inputs, targets), or the inputs alone (split_batch)
# The contract suite's guarantees a task may declare it cannot hold (``cannot_promise``), each skipped with its reason.
PROMISES = ("accumulation_equals_the_big_batch", "two_processes_equal_one", "learns_one_batch_by_heart")


class TaskContract:
    """What a task declares (``Task`` is this and the engine): its class attributes and the methods below."""

    # The metric it is judged by and its direction: the best checkpoint, early stopping, make runs and make sweep read
    # them unless the config names another.
    monitor: str = "val/loss"
    mode: Literal["min", "max"] = "min"
    # The targets it learns from, as the DataModule declares them; None: none (a generative or self-supervised task).
    target_kind: Literal["classes", "values"] | None = "classes"
    target_names: list[str]  # the DataModule's (a name per class, or per value), linked by the CLI
    # What its loss averages over: samples, or tokens (a loss per position; a target of IGNORE_INDEX counts for
    # nothing), weighted by token over the whole optimizer step.
    counted: Literal["samples", "tokens"] = "samples"
    class_dim: int = 1  # where a class-scored output keeps its classes: 1 (batch, classes, ...), -1 (..., classes)
    settable_at_predict: tuple[str, ...] = ()  # arguments on how to predict (a temperature) predict may change
    # The contract suite's guarantees (PROMISES) its loss cannot hold, each with why (in-batch negatives: a
    # micro-batch's loss is no share of the big batch's, so neither accumulation nor DDP equals the big batch).
    cannot_promise: dict[str, str] = {}  # noqa: RUF012  (a class's declaration)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if unknown := sorted(set(cls.cannot_promise) - set(PROMISES)):
            raise TypeError(f"{cls.__name__}.cannot_promise names {unknown}: a task may waive only {list(PROMISES)}.")

    def split_batch(self, batch: Batch) -> tuple[Any, Any]:
        """(what the net takes, what the loss compares): the pair itself, or (the batch, None) without targets."""
        if self.target_kind is None:
            return batch, None
        inputs, targets = batch
        return inputs, targets

    def loss(self, outputs: Tensor, targets: Tensor) -> Tensor:
        """The loss of each sample (or pixel), unreduced (``targets`` None for a task without)."""
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
        return header, [[f"{v:.6g}" for v in row] for row in predictions.reshape(len(predictions), -1).tolist()]

    def write_prediction_files(self, predictions: Tensor, folder: Path, datamodule: Any) -> None:
        """Files a prediction has beside its row (a segmentation's masks), written into ``folder`` and named in
        ``prediction_table``'s rows; none by default. ``datamodule`` decoded the inputs (their names, sizes)."""

    def output_head(self) -> nn.Module:
        """What follows ``forward`` in the exported model, applied to its outputs (the outputs ``output_description``
        describes): e.g. one view's embedding of several."""
        return nn.Identity()

    def output_description(self) -> dict[str, Any]:
        """``model.json``'s "output": the exported model's output name, shape and meaning (without targets, the
        task's own: say it here; "..." until then)."""
        if self.target_kind is None:
            return {"name": "outputs", "shape": ["batch", "..."]}
        return {"name": "outputs", "shape": ["batch", len(self.target_names)], "targets": self.target_names}
