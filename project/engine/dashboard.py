"""TensorBoard's Custom Scalars tab for every run: the charts that matter, train and val loss on one chart.

Written once per ``fit`` (rank 0) into the run's event file; TensorBoard merges the layouts of all runs it shows.
Each chart is a list of tag regexes, so it fits every run: ``lr-.*`` whatever the optimizer's name, peak memory
whether it is ``train/peak_gpu_mem_mb`` (CUDA) or ``train/peak_rss_mb`` (CPU). `make tensorboard` opens on it.
"""

import re

from lightning.pytorch.loggers import TensorBoardLogger


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
