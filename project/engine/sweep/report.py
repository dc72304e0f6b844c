"""What a sweep hands back: the table of trials, ``best.yaml`` (the best trial's full config, ready for
``make train CONFIG=...``) and plots a person would rather look at than read."""

import warnings
from pathlib import Path
from typing import Any

import optuna
import yaml
from jsonargparse import Namespace
from optuna.trial import TrialState

from project.engine.runs import columns
from project.engine.sweep.spec import shown

SWEEP_CALLBACK = f"{__package__}.trial.SweepTrial"  # named from this package: a renamed copy still finds it


def table(study: optuna.Study, spec: Namespace) -> str:
    trials = study.get_trials(deepcopy=False)
    keys = list(spec.params)
    header = ["trial", "state", spec.metric, "validations", "seconds", *keys, "note"]
    rows = [header]
    for t in trials:
        note = t.user_attrs.get("error") or ""
        if t.state == TrialState.PRUNED:
            note = f"pruned at epoch {t.user_attrs.get('pruned_at_epoch', '?')}"
        if "retry_of" in t.user_attrs:
            note = f"retry of {t.user_attrs['retry_of']}; {note}".rstrip("; ")
        value = f"{t.value:.4f}" if t.value is not None else ""
        rows.append([
            str(t.number), t.state.name.lower(), value, str(t.user_attrs.get("epochs", "")),
            str(t.user_attrs.get("seconds", "")), *(shown(t.params.get(k, "")) for k in keys), note,
        ])  # fmt: skip
    lines = columns(rows).splitlines()
    counts = {s.name.lower(): sum(t.state == s for t in trials) for s in TrialState}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    lines.append(
        f"{len(trials)} trials ({summary or 'none yet'}); the sweep asks for {spec.trials} completed or pruned."
    )
    best = _best(study)
    if best is not None:
        lines.append(f"best: trial {best.number}, {spec.metric}={best.value:.4f}")
    return "\n".join(lines)


def _best(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    return study.best_trial if any(t.state == TrialState.COMPLETE for t in study.get_trials(deepcopy=False)) else None


def write_best(study: optuna.Study, spec: Namespace, sweep_dir: Path, base: Namespace) -> Path | None:
    """The best completed trial's config.yaml (what that run really used, every default resolved) with the
    sweep's own parts removed: the reporting callback, and the logger writing into the sweep. Trained again with
    the same seed it reproduces the trial."""
    best = _best(study)
    run_config = sweep_dir / f"trial_{best.number}" / "config.yaml" if best else None
    if best is None or run_config is None or not run_config.is_file():
        return None
    config = yaml.safe_load(run_config.read_text())
    trainer = config["trainer"]
    trainer["callbacks"] = [cb for cb in trainer.get("callbacks") or [] if cb.get("class_path") != SWEEP_CALLBACK]
    logger_args, base_args = trainer["logger"]["init_args"], base.trainer.logger.init_args
    for key in ("save_dir", "name", "version"):
        logger_args[key] = base_args[key]
    chosen = ", ".join(f"{k}={shown(v)}" for k, v in best.params.items())
    header = (
        f"# The best trial of sweep {spec.name!r}: trial {best.number}, {spec.metric}={best.value:.6f} ({chosen}).\n"
        f"# Its full config; `make train CONFIG={sweep_dir / 'best.yaml'}` trains it again (same seed, same result).\n"
    )
    path = sweep_dir / "best.yaml"
    path.write_text(header + yaml.safe_dump(config, sort_keys=False))
    return path


def write_plots(study: optuna.Study, sweep_dir: Path) -> list[Path]:
    """history.png (the metric per trial and the best so far), curves.png (each trial's metric per epoch, the
    pruned ones cut short), importance.png (which keys mattered: fANOVA, needs 2+ completed trials)."""
    if not any(t.state == TrialState.COMPLETE for t in study.get_trials(deepcopy=False)):
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as plots

    written = []
    for name, plot in (
        ("history", plots.plot_optimization_history),
        ("curves", plots.plot_intermediate_values),
        ("importance", plots.plot_param_importances),
    ):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Optuna marks its matplotlib plots experimental
                axes: Any = plot(study)
        except (ValueError, RuntimeError):  # too few trials for this plot yet
            continue
        figure = (axes.flat[0] if hasattr(axes, "flat") else axes).figure
        figure.savefig(sweep_dir / f"{name}.png", dpi=110, bbox_inches="tight")
        plt.close(figure)
        written.append(sweep_dir / f"{name}.png")
    return written
