"""TensorBoard's Custom Scalars tab for every run: the charts that matter, train and val loss on one chart; and, after
the final test, the run's hyperparameters with its scores (the HPARAMS tab, runs side by side).

The layout is written once per ``fit`` (rank 0) into the run's event file; TensorBoard merges the layouts of all runs
it shows. Each chart is a list of tag regexes, so it fits every run: ``lr-.*`` whatever the optimizer's name, peak
memory whether it is ``train/peak_gpu_mem_mb`` (CUDA) or ``train/peak_rss_mb`` (CPU). `make tensorboard` opens on it.
"""

import re
from typing import Any

from lightning.pytorch.loggers import TensorBoardLogger

from project.engine.observe.config_keys import flatten

# Trainer settings that change results, shown beside the model's and data's in TensorBoard's HPARAMS view.
_TRAINER_HPARAMS = (
    "max_epochs",
    "max_steps",
    "precision",
    "accumulate_grad_batches",
    "gradient_clip_val",
    "devices",
    "num_nodes",
)


def layout(task: object) -> dict:
    """The charts for ``task``: the loss, then one chart per metric the task logs (``val/<name>``), the judged one
    first, then the learning rate and the gradient norm; speed and memory."""
    metrics = getattr(task, "val_metrics", None)
    names = [name.removeprefix("val/") for name in (metrics.keys() if metrics is not None else [])]
    judged = str(getattr(task, "monitor", "")).removeprefix("val/")
    names.sort(key=lambda name: name != judged)
    charts = {name: ["Multiline", [rf"^(train|val)/{re.escape(name)}$"]] for name in names}
    return {
        "training": {
            "loss (train and val)": ["Multiline", [r"^(train|val)/loss$"]],
            **charts,
            "learning rate": ["Multiline", [r"^lr-"]],
            "gradient norm (before clipping)": ["Multiline", [r"^train/grad_norm$"]],
        },
        "speed and memory": SPEED_AND_MEMORY,
    }


SPEED_AND_MEMORY = {
    "samples per second (this process, all processes)": ["Multiline", [r"^train/samples_per_sec"]],
    "data wait (fraction of the step spent waiting for data)": ["Multiline", [r"^train/data_wait$"]],
    "peak memory (MB)": ["Multiline", [r"^train/peak_.*_mb$"]],
}


def write_layout(logger: object, task: object) -> None:
    if isinstance(logger, TensorBoardLogger):
        logger.experiment.add_custom_scalars(layout(task))


def log_hparams_with(trainer: Any, config: Any, scores: dict[str, float]) -> None:
    """The run's hyperparameters with its final scores, for TensorBoard's HPARAMS view (runs side by side)."""
    if trainer.logger is None:
        return
    params = {
        **flatten(config.model.as_dict(), "model"),
        **flatten(config.data.as_dict(), "data"),
        **{f"trainer.{k}": config.trainer[k] for k in _TRAINER_HPARAMS},
        "seed_everything": config.seed_everything,
    }
    params = simple(params)
    metrics = {"hp/" + k.replace("best ", "").replace("/", "_"): v for k, v in scores.items()}
    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger):
            logger.log_hyperparams(params, metrics)
        else:  # other loggers take no metrics with their hparams: the scores are logged as metrics
            logger.log_hyperparams(params)
            logger.log_metrics(metrics, step=trainer.global_step)
        logger.finalize("success")  # flush: nothing else closes the writer after the test


def simple(params: dict[str, Any]) -> dict[str, Any]:
    """Values a logger's hyperparameters take (a list or None as its text)."""
    return {k: v if isinstance(v, int | float | str | bool) else str(v) for k, v in params.items()}
