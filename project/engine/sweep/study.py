"""Where a sweep's trials live, and who may start the next one.

One machine: a journal file in the sweep's directory (append-only, safe with several processes, Optuna's own advice
for one machine). Several machines: a database all reach (``storage:`` in the sweep file), with Optuna's heartbeat:
a trial whose worker stops beating for ``grace_period`` seconds (a lost machine) is failed and its values run again
by any live worker (``RetryHeartbeatStaleTrialCallback``). The journal has no heartbeat (optuna/optuna#6615): a
trial whose worker process on this machine has died is failed and retried the same way.
"""

import contextlib
import fcntl
import socket
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
from jsonargparse import Namespace
from optuna.storages import BaseStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import TrialState

from project.engine.errors import ConfigError
from project.engine.observe.runs import process_alive

HOST = socket.gethostname()
optuna.logging.set_verbosity(optuna.logging.ERROR)  # what a trial did is printed by the worker, in one line


def say_worker_gone(number: int) -> None:
    print(
        f"trial {number}: its worker is gone (a lost machine or a killed process): failed, its values queued again.",
        flush=True,
    )


class RetryStaleTrial(RetryHeartbeatStaleTrialCallback):
    """Optuna's retry of a trial whose heartbeat stopped, saying so, in the worker that found it: its own check
    before counting the trials (``fail_stale``), or Optuna's before each trial it runs."""

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        say_worker_gone(trial.number)
        super().__call__(study, trial)


def storage(spec: Namespace, sweep_dir: Path) -> BaseStorage:
    """The sweep file's ``storage`` URL with its heartbeat, or the journal file in ``sweep_dir`` (created).
    ``ConfigError``, the password hidden, if the database cannot be reached."""
    if not spec.storage:
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        sweep_dir.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(str(sweep_dir / "study.journal")))
    import sqlalchemy

    try:
        url = sqlalchemy.make_url(spec.storage).render_as_string(hide_password=True)
    except sqlalchemy.exc.ArgumentError:
        raise ConfigError(
            f"storage={spec.storage!r} is no database URL: e.g. postgresql://user:password@host:5432/database."
        ) from None
    for _attempt in range(3):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # heartbeat, retry
                return optuna.storages.RDBStorage(
                    spec.storage,
                    heartbeat_interval=spec.heartbeat_interval,
                    grace_period=spec.grace_period,
                    heartbeat_stale_trial_callback=RetryStaleTrial(max_retry=spec.max_retry),
                )
        except (ImportError, sqlalchemy.exc.NoSuchModuleError) as err:
            missing = getattr(err.__cause__ or err, "name", None) or str(err).strip().splitlines()[0]
            raise ConfigError(
                f"storage={url}: its database driver is not installed ({missing}): for postgresql:// make install "
                "EXTRAS=sweep-db (psycopg); for another database, pip install the SQLAlchemy driver its URL names."
            ) from None
        except sqlalchemy.exc.OperationalError as err:
            raise ConfigError(
                f"storage={url}: cannot connect ({str(err.orig).strip().splitlines()[0]}): check that the server runs "
                "and this machine reaches it, and the user, password and database in the URL."
            ) from None
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError) as err:
            # Machines creating Optuna's tables at once: one wins, the others find them made (optuna/optuna#1092).
            reason = str(err.orig).strip().splitlines()[0]
    raise ConfigError(f"storage={url}: Optuna cannot create its tables there ({reason}): check the user's rights.")


def open_study(spec: Namespace, sweep_dir: Path, **kwargs: Any) -> tuple[optuna.Study, BaseStorage]:
    """The study and its storage (Optuna keeps a study's own private, and some of a storage's API has no Study
    method: a user attribute of a trial set from outside it)."""
    store = storage(spec, sweep_dir)
    study = optuna.create_study(
        storage=store, study_name=spec.name, direction=spec.direction, load_if_exists=True, **kwargs
    )
    return study, store


def trial_id(study: optuna.Study, store: BaseStorage, number: int) -> int:
    """The storage's id of the study's trial ``number`` (Optuna keeps a trial's own id private)."""
    return store.get_trial_id_from_study_id_trial_number(store.get_study_id_from_name(study.study_name), number)


@contextlib.contextmanager
def lock(study: optuna.Study, store: BaseStorage, sweep_dir: Path) -> Iterator[None]:
    """One worker of any machine at a time between counting the trials and asking for one, so the sweep runs
    exactly ``trials``: a PostgreSQL advisory lock every machine sees, else a file lock in the sweep's directory
    (every worker of a journal or SQLite file is on this machine)."""
    engine = getattr(store, "engine", None)
    if engine is not None and engine.dialect.name == "postgresql":
        with engine.connect() as connection:  # the lock ends with this transaction (or connection)
            # A machine lost while holding it: the server ends the session after a minute idle in the transaction.
            connection.exec_driver_sql("SET idle_in_transaction_session_timeout = '60s'")
            connection.exec_driver_sql("SELECT pg_advisory_xact_lock(hashtext(%(name)s))", {"name": study.study_name})
            yield
        return
    with open(sweep_dir / "lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file is closed, or its process dies
        yield


def fail_stale(study: optuna.Study, store: BaseStorage, max_retry: int) -> None:
    """Fail the trials whose worker is gone and queue their values again, saying so. With a database: the
    heartbeat's verdict (``RetryStaleTrial``). With the journal: a trial signed by a process of this machine that no
    longer runs, or not signed at all (its worker died before it could sign, which it does under ``lock``). Call
    under ``lock``."""
    if isinstance(store, optuna.storages.RDBStorage):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)
        return
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        host, pid = trial.user_attrs.get("host"), trial.user_attrs.get("pid")
        if pid is None or (host == HOST and not process_alive(pid)):
            store.set_trial_user_attr(trial_id(study, store, trial.number), "error", f"its worker (pid {pid}) died")
            study.tell(trial.number, state=TrialState.FAIL)
            say_worker_gone(trial.number)
            retry(study, store, trial.number, max_retry)


def retry(study: optuna.Study, store: BaseStorage, number: int, max_retry: int | None = None) -> None:
    """Queue trial ``number``'s values again, as Optuna's heartbeat does: the retry says which trial it retries
    (``system_attrs['failed_trial']``) and runs before any new values."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        RetryHeartbeatStaleTrialCallback(max_retry=max_retry)(study, store.get_trial(trial_id(study, store, number)))
