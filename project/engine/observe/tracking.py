"""Experiment trackers beside the run directory: ``trackers:`` in a config (``configs/loggers/mlflow.yaml``, ...).

``trainer.logger`` stays the one logger that owns the run directory (TensorBoard: ``logs/<name>/version_<N>/``,
which every ``--trainer.logger.init_args.*`` override, the sweep and the in-place resume address). ``trackers`` is
a list of more Lightning loggers (``MLFlowLogger``, ``WandbLogger``, any other) that the CLI hands to the Trainer
after it, so Lightning logs every curve and hyperparameter to them too. ``TrackerRun`` (a callback of
configs/default.yaml, to which the CLI hands the trackers and the run's config) gives them what Lightning's loggers
leave out:

- ``<run>/trackers.json``: each tracker's run id, so ``make resume`` continues the same tracker run;
- the run's flattened config as params, its provenance as tags (commit, dirty, versions, host), and
  ``config.yaml`` and ``provenance.json`` as artifacts;
- one value per step across a resume: MLflow and W&B cannot delete what the crashed process logged after its
  last checkpoint, so the resumed segment skips, per metric, the steps the tracker already has (the resume is
  exact: they are the values it would log again).
"""

import importlib
import json
import os
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback

from project.engine.errors import ConfigError
from project.engine.hooks import defined_hooks_only
from project.engine.observe.provenance import Provenance, write_json

RECORD = "trackers.json"
# The logger classes whose package is an optional extra: class name -> (module to import, extra).
_EXTRAS = {"MLFlowLogger": ("mlflow", "mlflow"), "WandbLogger": ("wandb", "wandb")}


def require_extra(key: str, class_path: str) -> None:
    """A logger whose package is not installed is refused in one sentence naming the extra (Lightning's own error
    comes later, wrapped in jsonargparse's)."""
    name = str(class_path).rpartition(".")[2]
    if name not in _EXTRAS:
        return
    module, extra = _EXTRAS[name]
    try:
        importlib.import_module(module)
    except ImportError:
        raise ConfigError(
            f"{key}={name} needs the {extra} extra: pip install -e '.[{extra}]' (or make install EXTRAS={extra})."
        ) from None


def fill_in(tracker: Any, run_logger: Any) -> None:
    """Defaults that depend on the run (``tracker`` and ``run_logger`` are parsed configs): the experiment (MLflow)
    or project (W&B) is the run's experiment name, so a sweep's trials share one; MLflow's store is
    ``$MLFLOW_TRACKING_URI`` or a SQLite file under the logs; W&B writes under the logs too."""
    args = tracker.init_args
    save_dir = Path(run_logger.init_args.save_dir).resolve()
    name = run_logger.init_args.name
    kind = str(tracker.class_path).rpartition(".")[2]
    if kind == "MLFlowLogger":
        args.experiment_name = args.experiment_name or name
        # Lightning's logger reads no MLFLOW_TRACKING_URI (it falls back to a file store, which MLflow 3 refuses).
        # Written into the run's config.yaml: a resume finds the run on the server it was logged to.
        if not args.tracking_uri and os.environ.get("MLFLOW_TRACKING_URI"):
            args.tracking_uri = os.environ["MLFLOW_TRACKING_URI"]
        elif not args.tracking_uri:
            args.tracking_uri = f"sqlite:///{save_dir / 'mlflow.db'}"
            args.artifact_location = args.artifact_location or str(save_dir / "mlflow-artifacts")
    elif kind == "WandbLogger":
        args.project = args.project or name
        if str(args.save_dir) == ".":
            args.save_dir = str(save_dir)


def continue_runs(trackers: list[Any], run_dir: Path) -> None:
    """On resume: each tracker continues the run recorded in ``<run>/trackers.json`` (MLflow's ``run_id``, W&B's
    ``id``; Lightning's WandbLogger resumes with ``resume="allow"``)."""
    record = read_record(run_dir)
    for tracker in trackers:
        kind = str(tracker.class_path).rpartition(".")[2]
        recorded = record.get(kind, {})
        if kind == "MLFlowLogger" and recorded.get("run_id"):
            tracker.init_args.run_id = recorded["run_id"]
        elif kind == "WandbLogger" and recorded.get("id"):
            tracker.init_args.id = recorded["id"]


def read_record(run_dir: Path) -> dict[str, Any]:
    path = run_dir / RECORD
    return json.loads(path.read_text()) if path.is_file() else {}


@defined_hooks_only
class TrackerRun(Callback):
    """See the module's docstring. Rank 0 only: Lightning's loggers log from rank 0. Without trackers it does
    nothing."""

    def __init__(self) -> None:
        self.trackers: list[Any] = []  # the config's trackers and its resolved values, set by the CLI
        self.config: dict[str, Any] = {}
        self.run_dir: Path | None = None
        self.record: dict[str, Any] = {}

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        log_dir = trainer.log_dir  # a broadcast from rank 0: every rank must ask
        if stage != "fit" or not trainer.is_global_zero or not log_dir or not self.trackers:
            return
        self.run_dir = Path(log_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.record = read_record(self.run_dir)
        run_name = f"{self.run_dir.parent.name}/{self.run_dir.name}"
        for tracker in self.trackers:
            kind = type(tracker).__name__
            entry = self.record.setdefault(kind, {})
            entry.setdefault("logged_steps", {})
            if kind == "MLFlowLogger":
                entry.update(
                    run_id=tracker.run_id,
                    experiment_id=tracker.experiment_id,
                    tracking_uri=tracker.experiment.tracking_uri,
                )
                tracker.experiment.set_tag(tracker.run_id, "mlflow.runName", run_name)
                tracker.experiment.update_run(tracker.run_id, status="RUNNING")  # a resumed run was FAILED or FINISHED
                _write_once_params(tracker)
            elif kind == "WandbLogger":
                entry.update(id=tracker.experiment.id, project=tracker.name, dir=str(tracker.save_dir))
            self._skip_logged_steps(tracker, entry["logged_steps"])
            tracker.log_hyperparams(self.config)
        self._write()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The provenance as tags, once the Provenance callback (set up before this one) has its segment."""
        record = next((cb.record for cb in trainer.callbacks if isinstance(cb, Provenance)), None)  # type: ignore[attr-defined]
        if self.run_dir is None or not record or not record.get("segments"):
            return
        segment = record["segments"][-1]
        tags = {
            "run_dir": str(self.run_dir),
            "git.commit": segment["git"].get("commit"),
            "git.dirty": segment["git"].get("dirty"),
            "git.branch": segment["git"].get("branch"),
            **{f"versions.{k}": v for k, v in segment["versions"].items()},
            "host": segment["machine"]["host"],
            "segment": segment["segment"],
        }
        self.tag(tags)

    def tag(self, tags: dict[str, Any]) -> None:
        """Tags on every tracker's run (W&B: in its config, which holds what a run is grouped and filtered by)."""
        if self.run_dir is None:
            return
        for tracker in self.trackers:
            kind = type(tracker).__name__
            if kind == "MLFlowLogger":
                for key, value in tags.items():
                    tracker.experiment.set_tag(tracker.run_id, key, str(value))
            elif kind == "WandbLogger":
                tracker.experiment.config.update({f"tags/{k}": v for k, v in tags.items()}, allow_val_change=True)

    def upload(self) -> None:
        """config.yaml and provenance.json as artifacts of the tracker run (again at every end: they change)."""
        if self.run_dir is None:
            return
        names = ("config.yaml", "provenance.json")
        files = [self.run_dir / name for name in names if (self.run_dir / name).is_file()]
        for tracker in self.trackers:
            kind = type(tracker).__name__
            for path in files:
                if kind == "MLFlowLogger":
                    tracker.experiment.log_artifact(tracker.run_id, str(path))
                elif kind == "WandbLogger":
                    # Under files/<version>/: W&B keeps its own config.yaml in files/.
                    tracker.experiment.save(str(path), base_path=str(self.run_dir.parent), policy="now")

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self.upload()

    def _skip_logged_steps(self, tracker: Any, logged: dict[str, int]) -> None:
        """Wraps the tracker's ``log_metrics``: a metric at a step not after the last one it logged is dropped
        (the resumed segment replaying what the crashed process logged past its checkpoint); the last step of
        each metric is kept in ``trackers.json``, for the next resume."""
        log_metrics = tracker.log_metrics

        def log_new_steps(metrics: Any, step: int | None = None) -> None:
            at = step or 0
            new = {k: v for k, v in metrics.items() if at > logged.get(k, -1)}
            if not new:
                return
            log_metrics(new, step)
            logged.update(dict.fromkeys(new, at))
            self._write()

        tracker.log_metrics = log_new_steps  # type: ignore[method-assign]

    def _write(self) -> None:
        assert self.run_dir is not None
        write_json(self.run_dir / RECORD, self.record)


def _write_once_params(tracker: Any) -> None:
    """MLflow refuses a param logged again with another value (a resumed run given other trainer flags): params
    keep their first value, what changed is in the run's provenance.json."""
    existing = tracker.experiment.get_run(tracker.run_id).data.params
    log_hyperparams = tracker.log_hyperparams

    def log_new_params(params: Any) -> None:
        # Private: the keys MLFlowLogger logs are made by these two (no public way; Lightning #19889, #17830); the
        # tracker resume test fails if they change.
        from lightning.fabric.utilities.logger import _convert_params, _flatten_dict

        flat = _flatten_dict(_convert_params(params))
        new = {k: v for k, v in flat.items() if k not in existing}
        if new:
            log_hyperparams(new)
            existing.update({k: str(v) for k, v in new.items()})

    tracker.log_hyperparams = log_new_params  # type: ignore[method-assign]
