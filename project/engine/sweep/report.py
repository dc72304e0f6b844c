"""What a sweep hands back: the table of trials, ``best.yaml`` (the best trial's full config, ready for
``make train CONFIG=...``) and plots a person would rather look at than read."""

import warnings
from pathlib import Path
from typing import Any

import optuna
from jsonargparse import Namespace
from optuna.trial import TrialState

from project.engine.observe.runs import columns
from project.engine.sweep.spec import base_args, flag, shown
from project.engine.sweep.study import HOST


def table(study: optuna.Study, spec: Namespace) -> str:
    trials = study.get_trials(deepcopy=False)
    keys = list(spec.params)
    header = ["trial", "state", spec.metric, "validations", "seconds", *keys, "note"]
    rows = [header]
    for t in trials:
        note = ""
        if t.state == TrialState.FAIL:
            note = t.user_attrs.get("error") or "its worker stopped beating (a lost machine, or a killed worker)"
        if t.state == TrialState.PRUNED:
            note = f"pruned at epoch {t.user_attrs.get('pruned_at_epoch', '?')}"
        if "failed_trial" in t.system_attrs:  # RetryHeartbeatStaleTrialCallback.retried_trial_number (experimental)
            note = f"retry of {t.system_attrs['failed_trial']}; {note}".rstrip("; ")
        if t.state != TrialState.WAITING and t.user_attrs.get("host") not in (None, HOST):
            note = f"on {t.user_attrs['host']}; {note}".rstrip("; ")
        value = f"{t.value:.4f}" if t.value is not None else ""
        rows.append(
            [
                str(t.number),
                t.state.name.lower(),
                value,
                str(t.user_attrs.get("epochs", "")),
                str(t.user_attrs.get("seconds", "")),
                *(shown(t.params.get(k, "")) for k in keys),
                note,
            ]
        )
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


def write_best(study: optuna.Study, spec: Namespace, sweep_dir: Path, cli: Any) -> Path | None:
    """The best completed trial's full config (every default resolved, as its run saved it) without the sweep's own
    parts (the reporting callback, the logger writing into the sweep), parsed by ``cli`` here, so that it is written
    on any machine of the sweep. Trained again with the same seed it reproduces the trial."""
    best = _best(study)
    if best is None:
        return None
    config = cli.parser.parse_args([*base_args(spec), *(flag(k, v) for k, v in best.params.items())])
    chosen = ", ".join(f"{k}={shown(v)}" for k, v in best.params.items())
    header = (
        f"# The best trial of sweep {spec.name!r}: trial {best.number}, {spec.metric}={best.value:.6f} ({chosen}).\n"
        f"# Its full config; `make train CONFIG={sweep_dir / 'best.yaml'}` trains it again (same seed, same result).\n"
    )
    path = sweep_dir / "best.yaml"
    path.write_text(header + cli.parser.dump(config, skip_none=False))
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
