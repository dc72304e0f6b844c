"""Finding runs under logs/ and reading their curves back (for notebooks and tests)."""

from pathlib import Path


def latest_run(logs_dir: str | Path = "logs") -> Path | None:
    """The run directory (``<logs>/<name>/version_<N>``) whose ``checkpoints/last.ckpt`` is newest, as
    `make resume` picks it; None when there is none."""
    checkpoints = sorted(Path(logs_dir).glob("*/version_*/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime)
    return checkpoints[-1].parent.parent if checkpoints else None


def read_scalars(run_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series of a run, ``{tag: [(step, value), ...]}``, read with TensorBoard's own reader (which
    also applies the purge of steps re-run after a resume)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    accumulator.Reload()
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}
