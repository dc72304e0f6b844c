"""The sweep file (``configs/sweeps/*.yaml``): which config keys to search, over what, for which metric.

Read with jsonargparse, like every other config: a key of the file is an argument of ``Sweep``, type-checked, and
``sampler``/``pruner`` are any Optuna class given by ``class_path``. The space's keys are then checked against the
project's own CLI (parsed, nothing built) before any trial runs, so a typo costs one sentence, not a sweep.
"""

import inspect
import json
import pydoc
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import optuna
from jsonargparse import ArgumentParser, Namespace
from jsonargparse.typing import NonNegativeInt, PositiveInt
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from project.engine.errors import ConfigError, config_error_in


@dataclass
class Param:
    """One searched key: ``choices``, or a range ``low``..``high`` (integers if both ends are integers)."""

    low: int | float | None = None
    high: int | float | None = None
    log: bool = False
    step: int | float | None = None
    choices: list[bool | int | float | str] | None = None


class Sweep:
    """The sweep file: every key is one of these arguments.

    Args:
        params: the search space, ``{config key: Param}``; a key is any ``--key=value`` the CLI takes.
        configs: the configs every trial trains with (``--config`` each, in order).
        args: further ``--key=value`` flags for every trial (e.g. a shorter ``--trainer.max_epochs``).
        name: the study's name and the sweep's directory, ``<logger save_dir>/sweeps/<name>`` (default: this
            file's name); another name starts another study (in a shared ``storage`` too).
        metric: what a trial reports at every validation and the study optimises: its best value in the run
            (default: the metric the configs' task is judged by, e.g. val/acc, val/rmse).
        direction: maximize or minimize ``metric`` (default: the task's direction for its own metric; give it
            when ``metric`` names another).
        trials: how many trials to finish (completed or pruned; failed ones are not counted).
        seed: the sampler's seed: a new trial's values are proposed with ``seed`` plus the number of trials before
            it, so workers on any machine propose different values, and a sweep of one worker repeats exactly.
        sampler: an ``optuna.samplers`` class (default: TPESampler with ``seed``).
        pruner: an ``optuna.pruners`` class (default: MedianPruner(n_startup_trials=3, n_warmup_steps=2));
            ``optuna.pruners.NopPruner`` turns pruning off.
        storage: a database every worker reaches, for workers on several machines (``postgresql://user:password@
            host/db``, ``make install EXTRAS=sweep-db``; any SQLAlchemy URL Optuna takes); default: a journal
            file in the sweep's directory (one machine).
        heartbeat_interval: with ``storage``: seconds between a running trial's heartbeats.
        grace_period: with ``storage``: a trial without a heartbeat for this long is failed (its machine is
            lost, or its worker killed), and its values run again on a live worker.
        max_retry: how many times one trial's values run again after their worker was lost.
    """

    def __init__(
        self,
        params: dict[str, Param],
        configs: list[str] = ["configs/default.yaml"],  # noqa: B006 (jsonargparse reads defaults, never mutates)
        args: list[str] = [],  # noqa: B006
        name: str | None = None,
        metric: str | None = None,
        direction: Literal["maximize", "minimize"] | None = None,
        trials: PositiveInt = 20,
        seed: int = 0,
        sampler: optuna.samplers.BaseSampler | None = None,
        pruner: optuna.pruners.BasePruner | None = None,
        storage: str | None = None,
        heartbeat_interval: PositiveInt = 30,
        grace_period: PositiveInt = 120,
        max_retry: NonNegativeInt = 2,
    ) -> None:
        """Read by jsonargparse, never called."""


def parser() -> ArgumentParser:
    parser = ArgumentParser(exit_on_error=False, parser_mode="yaml")
    parser.add_class_arguments(Sweep, as_group=False)
    return parser


def load(path: str | Path) -> Namespace:
    """The sweep file, parsed and type-checked; ``name`` filled in. A ``ConfigError`` naming the bad key."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"sweep file {str(path)!r} does not exist (see configs/sweeps/ for examples).")
    try:
        spec = parser().parse_path(path)
    except Exception as err:  # jsonargparse's ArgumentError: the first line names the key and the value
        raise ConfigError(f"{path}: {str(err).strip().splitlines()[0]}") from None
    spec.name = spec.name or path.stem
    if not spec.params:
        raise ConfigError(f"{path}: params is empty: name at least one config key to search.")
    distributions(spec)  # each range checked
    return spec


def distributions(spec: Namespace) -> dict[str, Any]:
    return {key: distribution(key, param) for key, param in spec.params.items()}


def distribution(key: str, param: Any) -> Any:
    """The Optuna distribution of one ``Param``; a ``ConfigError`` naming ``key`` if Optuna refuses the range."""
    p = param if isinstance(param, Param) else Param(**dict(param))
    try:
        if p.choices is not None and (p.low, p.high) == (None, None):
            return CategoricalDistribution(p.choices)
        if p.choices is not None or p.low is None or p.high is None:
            raise ValueError("give low and high (a range) or choices (a list), not both")
        if all(isinstance(v, int) and not isinstance(v, bool) for v in (p.low, p.high, p.step or 1)):
            return IntDistribution(int(p.low), int(p.high), log=p.log, step=int(p.step or 1))
        return FloatDistribution(float(p.low), float(p.high), log=p.log, step=p.step)
    except ValueError as err:
        raise ConfigError(f"params.{key}: {err}.") from None


def suggest(trial: optuna.Trial, key: str, dist: Any) -> Any:
    """Trial ``trial``'s value of ``key`` (the queued one, for a retry)."""
    if isinstance(dist, CategoricalDistribution):
        return trial.suggest_categorical(key, dist.choices)
    suggest_number = trial.suggest_int if isinstance(dist, IntDistribution) else trial.suggest_float
    return suggest_number(key, dist.low, dist.high, log=dist.log, step=dist.step)


def build(spec: Namespace, offset: int = 0) -> tuple[optuna.samplers.BaseSampler, optuna.pruners.BasePruner]:
    """The sampler and pruner the file names; a sampler that takes a seed gets ``seed + offset``."""
    sampler = (spec.sampler or Namespace(class_path="optuna.samplers.TPESampler")).clone()
    # pydoc.locate, not checks.kind_of: a worker builds a sampler for every trial and needs no Lightning import.
    if "seed" in inspect.signature(cast(type, pydoc.locate(sampler.class_path))).parameters:
        sampler.init_args = sampler.get("init_args") or Namespace()
        sampler.init_args.seed = (sampler.init_args.get("seed") or spec.seed) + offset
    pruner = spec.pruner or Namespace(
        class_path="optuna.pruners.MedianPruner", init_args=Namespace(n_startup_trials=3, n_warmup_steps=2)
    )
    built = parser().instantiate_classes(Namespace(params={}, sampler=sampler, pruner=pruner))
    return built.sampler, built.pruner


def flag(key: str, value: Any) -> str:
    """``--key=value`` as the CLI parses it (YAML: strings as they are, numbers and booleans as literals)."""
    return f"--{key}={value if isinstance(value, str) else json.dumps(value)}"


def shown(value: Any) -> str:
    """A searched value, short (4 significant digits for floats)."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def base_args(spec: Namespace) -> list[str]:
    """What every trial's ``fit`` is given before its own values: ``--config`` per config, then ``args``."""
    return [a for c in spec.configs for a in ("--config", c)] + list(spec.args)


def check_against_cli(spec: Namespace) -> Any:
    """The project's CLI, given the sweep's configs and args and then each searched key at each end of its range
    (each choice), parsed (nothing built). Fills in the sweep's ``metric``/``direction`` from the task when the
    file leaves them out; which metrics a task logs is known once it is built, so the config's classes are built
    once (no Trainer) when the metric is another. Returns the CLI: ``.config`` (no searched value), ``.parser``.
    ``ConfigError`` naming what the CLI refuses."""
    from project.engine.run.checks import kind_of
    from project.engine.run.cli import CLI

    class ParseOnly(CLI):
        def init_parser(self, **kwargs: Any) -> Any:
            return super().init_parser(**kwargs, exit_on_error=False)

        def _set_seed(self) -> None:
            pass

        def before_instantiate_classes(self) -> None:
            pass

        def instantiate_classes(self) -> None:
            pass

        def after_instantiate_classes(self) -> None:
            pass

    base = base_args(spec)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # LightningCLI warns when given args while sys.argv has others
            cli = ParseOnly(base, run=False)
    except Exception as err:
        raise ConfigError(f"the sweep's configs/args are refused by the CLI: {_first_line(err)}") from None
    for key, dist in distributions(spec).items():
        for value in dist.choices if isinstance(dist, CategoricalDistribution) else (dist.low, dist.high):
            try:
                cli.parser.parse_args([*base, flag(key, value)])
            except Exception as err:
                raise ConfigError(
                    f"params.{key}: the CLI refuses --{key}={value!r}: {_first_line(err)} (a searched key is any "
                    "config key, e.g. model.init_args.lr, data.init_args.batch_size)."
                ) from None
    task: Any = kind_of(cli.config.model)
    judged_by, direction = task.monitor, task.mode
    if spec.metric not in (None, task.monitor) or (cli.config.model.get("init_args") or {}).get("monitor"):
        try:  # built as a trial builds them: the data read, the net made
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                built = cli.parser.instantiate_classes(cli.config)["model"]
        except ValueError as err:  # what a constructor refused (e.g. the data is not there), in its own words
            raise (config_error_in(err) or err) from None
        logged = {"val/loss", *built.val_metrics.keys()}
        judged_by, direction = built.monitor, built.mode
        if spec.metric not in (None, *logged):
            raise ConfigError(
                f"metric={spec.metric!r}: {task.__name__} does not log it; it logs {', '.join(sorted(logged))} after "
                "every validation (leave metric out for the one it is judged by)."
            )
    spec.metric = spec.metric or judged_by
    if spec.direction is None and spec.metric != judged_by:
        raise ConfigError(
            f"metric={spec.metric!r} is not the metric {task.__name__} is judged by ({judged_by}): give its "
            "direction (maximize or minimize) in the sweep file."
        )
    spec.direction = spec.direction or ("maximize" if direction == "max" else "minimize")
    logger = cli.config.trainer.logger
    if not all(k in (getattr(logger, "init_args", None) or {}) for k in ("save_dir", "name", "version")):
        raise ConfigError(
            f"trainer.logger={getattr(logger, 'class_path', logger)!r}: a sweep puts each trial in its own run "
            "directory through the logger's save_dir/name/version: use TensorBoardLogger or CSVLogger."
        )
    return cli


def _first_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    return " ".join(lines[:2]) if lines else type(err).__name__
