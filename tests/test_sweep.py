"""`make sweep`: a search whose trials are normal runs, which survives a killed worker, prunes a DDP trial on
every rank at once, refuses a bad space before running anything, and hands back a config that reproduces the
best trial."""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
import torch
import yaml
from conftest import DIGITS, PYTHONPATH, ROOT, free_port, run_module, wait_or_kill
from optuna.storages.journal import JournalFileBackend, JournalStorage
from optuna.trial import TrialState

from project.engine.checkpointing.checkpoint_io import load_checkpoint
from project.engine.sweep.__main__ import main

DDP = str(ROOT / "configs" / "ddp.yaml")
TRIALS = 6


def write_spec(path: Path, logs: Path, **overrides: object) -> Path:
    """A sweep of short MLP runs on digits, logging under ``logs``. A random sampler (seeded per worker) over
    lr choices that include a hopeless 1e-5, so the median pruner has trials to stop."""
    spec = {
        "configs": [DIGITS],
        "args": [
            f"--trainer.logger.init_args.save_dir={logs}", "--trainer.max_epochs=4", "--model.net=toy.MLP",
            "--trainer.enable_progress_bar=false", "--trainer.limit_train_batches=10",
        ],
        "trials": TRIALS,
        "sampler": {"class_path": "optuna.samplers.RandomSampler"},
        "pruner": {"class_path": "optuna.pruners.MedianPruner", "init_args": {"n_startup_trials": 2,
                                                                           "n_warmup_steps": 1}},
        "params": {
            "model.optimizer.init_args.lr": {"choices": [0.01, 1.0e-5]},
            "model.net.init_args.dropout": {"low": 0.0, "high": 0.3},
        },
        **overrides,
    }  # fmt: skip
    path.write_text(yaml.safe_dump(spec))
    return path


def sweep(spec: Path, *args: str, command: list[str] | None = None) -> subprocess.Popen[str]:
    """``python -m project.engine.sweep`` as `make sweep` runs it (or ``command``), in its own process group
    (``finish`` kills it whole on timeout)."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONWARNINGS": "ignore",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "PYTHONPATH": PYTHONPATH,
    }  # fmt: skip (probes importable)
    return subprocess.Popen(
        command or [sys.executable, "-m", "project.engine.sweep", str(spec), *args],
        cwd=spec.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip


def finish(proc: subprocess.Popen[str], timeout: float = 400) -> tuple[int, str]:
    out, _ = wait_or_kill(proc, timeout, "the sweep")
    return proc.returncode, out


def load(sweep_dir: Path, name: str) -> optuna.Study:
    storage = JournalStorage(JournalFileBackend(str(sweep_dir / "study.journal")))
    return optuna.load_study(study_name=name, storage=storage)


def trials_so_far(sweep_dir: Path, name: str) -> list[optuna.trial.FrozenTrial]:
    """The study's trials while the sweep runs: none before its journal holds the study (the file is there a moment
    before the study's record is)."""
    try:
        return load(sweep_dir, name).get_trials() if (sweep_dir / "study.journal").exists() else []
    except KeyError:  # Optuna's "Record does not exist.": the study is not created yet
        return []


@pytest.fixture(scope="module")
def killed_and_continued(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A 2-worker sweep; one worker is SIGKILLed while its trial is between two validations (every trial holds
    there until released, so the kill cannot come too late); the other worker must finish the study. Then the same
    command again, which has nothing left to do."""
    base = tmp_path_factory.mktemp("sweep")
    hold = ["--trainer.callbacks+=probes.Hold", f"--trainer.callbacks.release={base / 'release'}"]
    spec = write_spec(base / "search.yaml", base / "logs")
    spec_args = yaml.safe_load(spec.read_text())["args"]
    spec = write_spec(base / "search.yaml", base / "logs", args=[*spec_args, *hold])
    sweep_dir = base / "logs" / "sweeps" / "search"
    first = sweep(spec, "--workers", "2")
    victim = None
    deadline = time.monotonic() + 300
    while victim is None and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
        running = [t for t in trials_so_far(sweep_dir, "search") if t.state == TrialState.RUNNING]
        victim = next((t for t in running if t.intermediate_values and t.number >= 1), None)
    assert victim is not None, "no trial was seen running between two validations"
    os.kill(victim.user_attrs["pid"], signal.SIGKILL)
    (base / "release").touch()  # the other worker's trials go on
    first_code, first_out = finish(first)
    second_code, second_out = finish(sweep(spec, "--workers", "2"))
    return {
        "dir": sweep_dir, "victim": victim, "first": (first_code, first_out),
        "second": (second_code, second_out), "study": load(sweep_dir, "search"), "base": base,
    }  # fmt: skip


@pytest.mark.guarantee(
    "a sweep of 6 trials on 2 workers, one worker SIGKILLed mid-trial: the other fails its trial and runs its "
    "values again; exactly 6 completed or pruned trials, none left running, one run directory per trial, each a "
    "normal tested run"
)
@pytest.mark.slow
def test_a_killed_worker_leaves_its_trial_to_be_retried_and_the_study_finishes(killed_and_continued: dict) -> None:
    run = killed_and_continued
    victim = run["victim"]
    first_code, first_out = run["first"]
    assert first_code == 1, first_out  # a worker died: the launcher says so
    assert f"trial {victim.number}: its worker is gone" in first_out
    second_code, second_out = run["second"]
    assert second_code == 0, second_out  # nothing left to run

    trials = run["study"].get_trials()
    states = [t.state for t in trials]
    assert TrialState.RUNNING not in states and TrialState.WAITING not in states
    assert sum(s in (TrialState.COMPLETE, TrialState.PRUNED) for s in states) == TRIALS  # exactly, not more
    assert TrialState.COMPLETE in states and TrialState.PRUNED in states
    killed = trials[victim.number]
    assert killed.state == TrialState.FAIL and "died" in killed.user_attrs["error"]
    # Its trial process got SIGTERM from the kernel when the worker died, and stopped with a checkpoint.
    console = (run["dir"] / f"trial_{victim.number}" / "console.log").read_text()
    assert "Interrupted by SIGTERM" in console
    assert (run["dir"] / f"trial_{victim.number}" / "checkpoints" / "last.ckpt").is_file()
    retries = [t for t in trials if t.system_attrs.get("failed_trial") == victim.number]  # Optuna's retry mark
    assert len(retries) == 1 and retries[0].params == victim.params
    assert retries[0].state in (TrialState.COMPLETE, TrialState.PRUNED)


@pytest.mark.guarantee(
    "a sweep of 6 trials on 2 workers, one worker SIGKILLed mid-trial: the other fails its trial and runs its "
    "values again; exactly 6 completed or pruned trials, none left running, one run directory per trial, each a "
    "normal tested run"
)
@pytest.mark.slow
def test_each_trial_is_a_normal_run_in_its_own_directory(killed_and_continued: dict) -> None:
    run, trials = killed_and_continued, killed_and_continued["study"].get_trials()
    sweep_dir: Path = run["dir"]
    assert sorted(p.name for p in sweep_dir.glob("trial_*")) == sorted(f"trial_{t.number}" for t in trials)
    for trial in trials:
        run_dir = sweep_dir / f"trial_{trial.number}"
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        assert (
            config["model"]["init_args"]["optimizer"]["init_args"]["lr"] == trial.params["model.optimizer.init_args.lr"]
        )
        assert config["model"]["init_args"]["net"]["init_args"]["dropout"] == pytest.approx(
            trial.params["model.net.init_args.dropout"]
        )
        assert list(run_dir.glob("events.out.tfevents.*"))
        if trial.state == TrialState.FAIL:
            continue
        # Every finished trial was tested and sits in TensorBoard's HPARAMS view (hp/ metrics with its values).
        assert (run_dir / "hparams.yaml").is_file()
        assert "Test of" in (run_dir / "console.log").read_text()
        # Reported once per epoch; a pruned trial stopped at the epoch it was pruned, with a loadable last.ckpt.
        epochs = len(trial.intermediate_values)
        last = load_checkpoint(run_dir / "checkpoints" / "last.ckpt")
        assert last["epoch"] == epochs - 1
        if trial.state == TrialState.PRUNED:
            assert trial.user_attrs["pruned_at_epoch"] == epochs - 1 < 3
        else:
            assert epochs == 4 and trial.value == max(trial.intermediate_values.values())


@pytest.mark.guarantee("`best.yaml` trained again reaches the best trial's metric (1e-6)")
@pytest.mark.slow
def test_best_yaml_trains_the_best_trial_again_to_the_same_metric(killed_and_continued: dict) -> None:
    run = killed_and_continued
    study, best_yaml = run["study"], run["dir"] / "best.yaml"
    config = yaml.safe_load(best_yaml.read_text())
    assert not any("sweep" in cb["class_path"] for cb in config["trainer"]["callbacks"])
    assert config["trainer"]["logger"]["init_args"]["name"] == "digits"  # logs like any run, not into the sweep
    result = run_module("fit", "--config", str(best_yaml), forked=True)
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = Path(run["base"]) / "logs" / "digits" / "version_0"
    best = load_checkpoint(run_dir / "checkpoints" / "best.ckpt")
    score = next(s["best_model_score"] for s in best["callbacks"].values() if "best_model_score" in s)
    # Same config, same seed, same thread count: the same computation, so the same accuracy (a ratio of counts).
    assert float(score) == pytest.approx(study.best_value, abs=1e-6)


@pytest.mark.slow
def test_sweep_status_prints_every_trial_and_writes_the_plots(killed_and_continued: dict, capsys) -> None:
    run = killed_and_continued
    assert main([str(run["base"] / "search.yaml"), "--status"]) == 0
    out = capsys.readouterr().out
    states = {s.name.lower() for s in TrialState}
    rows = {cells[0]: cells[1] for line in out.splitlines() if len(cells := line.split()) > 1 and cells[1] in states}
    assert rows == {str(t.number): t.state.name.lower() for t in run["study"].get_trials()}
    assert f"best: trial {run['study'].best_trial.number}, val/acc={run['study'].best_value:.4f}" in out
    for name in ("history", "curves", "importance"):
        png = (run["dir"] / f"{name}.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


@pytest.mark.guarantee(
    "a 2-process DDP trial is pruned on both ranks at the same epoch; Ctrl-C stops a sweep with a checkpoint and "
    "queues the trial again"
)
@pytest.mark.slow
def test_a_ddp_trial_is_pruned_on_every_rank_at_the_same_epoch(tmp_path: Path) -> None:
    # A pruner that prunes every trial at its second validation (accuracy is never 2 or more): rank 0 decides.
    pruner = {"class_path": "optuna.pruners.ThresholdPruner", "init_args": {"lower": 2.0, "n_warmup_steps": 1}}
    spec = write_spec(tmp_path / "ddp.yaml", tmp_path / "logs", trials=1, pruner=pruner,
                      configs=[DIGITS, DDP], params={"model.optimizer.init_args.lr": {"choices": [0.01]}})  # fmt: skip
    code, out = finish(sweep(spec))
    assert code == 0, out
    trial = load(tmp_path / "logs" / "sweeps" / "ddp", "ddp").get_trials()[0]
    assert trial.state == TrialState.PRUNED and trial.user_attrs["pruned_at_epoch"] == 1
    console = (tmp_path / "logs" / "sweeps" / "ddp" / "trial_0" / "console.log").read_text()
    assert "[rank 0] trial 0 pruned at epoch 1" in console and "[rank 1] trial 0 pruned at epoch 1" in console


@pytest.mark.parametrize(
    ("epoch", "max_epochs", "last_batch", "step", "max_steps", "pruned"),
    [
        (0, 2, True, 10, -1, True),
        (1, 2, False, 15, -1, True),
        (1, 2, True, 20, -1, False),
        (5, -1, True, 60, -1, True),
        (0, 2, False, 5, 5, False),
    ],
)
def test_a_trial_is_never_pruned_at_its_last_validation(
    epoch: int, max_epochs: int, last_batch: bool, step: int, max_steps: int, pruned: bool
) -> None:
    from types import SimpleNamespace

    from project.engine.sweep.trial import SweepTrial

    # A pruner that prunes at every validation (accuracy is never 2): only the run's last one is spared, the end of
    # its last epoch (or its max_steps); mid-epoch validations and runs without an epoch limit are not the last.
    study = optuna.create_study(direction="maximize", pruner=optuna.pruners.ThresholdPruner(lower=2.0))
    callback = SweepTrial("unused", trial=0)
    callback.metric, callback._trial = "val/acc", study.ask()
    trainer = SimpleNamespace(
        sanity_checking=False, callback_metrics={"val/acc": torch.tensor(0.5)}, current_epoch=epoch,
        max_epochs=max_epochs, is_last_batch=last_batch, global_step=step, max_steps=max_steps, is_global_zero=True,
        global_rank=0, strategy=SimpleNamespace(broadcast=lambda decision: decision), should_stop=False,
    )  # fmt: skip
    callback.on_validation_end(trainer, None)  # type: ignore[arg-type]
    assert trainer.should_stop is pruned and (callback.pruned_at == epoch) is pruned


def test_the_shipped_sweep_file_is_a_valid_space(monkeypatch) -> None:
    from project.engine.sweep import spec

    monkeypatch.chdir(ROOT)  # its configs are relative to the repository, as `make sweep` runs it
    shipped = spec.load(ROOT / "configs" / "sweeps" / "default.yaml")
    assert spec.check_against_cli(shipped).config.trainer.logger.init_args.save_dir == "logs"
    assert shipped.name == "default" and shipped.trials >= 8


@pytest.mark.guarantee(
    "a 2-process DDP trial is pruned on both ranks at the same epoch; Ctrl-C stops a sweep with a checkpoint and "
    "queues the trial again"
)
@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_stops_the_sweep_with_a_checkpoint_and_queues_the_trial_again(signum: int, tmp_path: Path) -> None:
    # Trial 0 holds between its first two epochs until it is told to stop: the Ctrl-C lands mid-trial.
    args = [f"--trainer.logger.init_args.save_dir={tmp_path / 'logs'}", "--trainer.max_epochs=4",
            "--model.net=toy.MLP", "--trainer.enable_progress_bar=false", "--trainer.callbacks+=probes.Hold",
            f"--trainer.callbacks.release={tmp_path / 'never'}"]  # fmt: skip
    spec = write_spec(tmp_path / "s.yaml", tmp_path / "logs", trials=2, args=args)
    proc = sweep(spec)
    sweep_dir = tmp_path / "logs" / "sweeps" / "s"
    deadline, reported = time.monotonic() + 200, False
    while not reported and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
        reported = any(t.intermediate_values for t in trials_so_far(sweep_dir, "s"))
    assert reported, "trial 0 never reported"
    if signum == signal.SIGINT:
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in the terminal does: the whole foreground process group
    else:
        proc.send_signal(signal.SIGTERM)  # what SLURM does before a time limit: to the launcher (slurm_sweep.sbatch)
    code, out = finish(proc)
    assert code == 130 and "run the same command again" in out, out
    trials = load(sweep_dir, "s").get_trials()
    name = signal.Signals(signum).name
    assert trials[0].state == TrialState.FAIL and trials[0].user_attrs["error"] == f"interrupted by {name}"
    queued = [t for t in trials if t.state == TrialState.WAITING]
    assert len(queued) == 1 and queued[0].system_attrs["failed_trial"] == 0
    assert queued[0].params == trials[0].params
    assert f"Interrupted by {name}" in (sweep_dir / "trial_0" / "console.log").read_text()
    assert (sweep_dir / "trial_0" / "checkpoints" / "last.ckpt").is_file()


BAD_SPACES = {
    "unknown key": ({"model.lrr": {"low": 0.001, "high": 0.1}}, "params.model.lrr"),
    "empty range": (
        {"model.optimizer.init_args.lr": {"low": 0.1, "high": 0.001}},
        "params.model.optimizer.init_args.lr: `low <= high` must hold, but got (low=0.1, high=0.001).",
    ),
    "wrong type": ({"data.batch_size": {"choices": ["big"]}}, "params.data.batch_size: the CLI refuses"),
    "log of zero": (
        {"model.optimizer.init_args.weight_decay": {"low": 0, "high": 0.1, "log": True}},
        "params.model.optimizer.init_args.weight_decay",
    ),
    "no range": (
        {"model.optimizer.init_args.lr": {"low": 0.001}},
        "params.model.optimizer.init_args.lr: give low and high (a range) or choices (a list)",
    ),
}


@pytest.mark.guarantee("a bad sweep space exits 2 naming the key before anything runs; a missing extra is named")
@pytest.mark.parametrize("case", BAD_SPACES)
def test_a_bad_space_is_refused_before_anything_runs(case: str, tmp_path: Path, capsys) -> None:
    params, expected = BAD_SPACES[case]
    spec = write_spec(tmp_path / "bad.yaml", tmp_path / "logs", params=params)
    assert main([str(spec)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and expected in err and len(err.splitlines()) == 1
    assert not (tmp_path / "logs").exists()  # no study, no directory


def test_an_unknown_sweep_setting_is_refused_naming_it(tmp_path: Path, capsys) -> None:
    spec = write_spec(tmp_path / "bad.yaml", tmp_path / "logs", trails=8)
    assert main([str(spec)]) == 2
    err = capsys.readouterr().err
    assert "trails" in err and len(err.strip().splitlines()) == 1


@pytest.mark.guarantee("a bad sweep space exits 2 naming the key before anything runs; a missing extra is named")
def test_without_optuna_installed_make_sweep_names_the_extra(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "optuna", None)  # what `import optuna` sees when it is not installed
    assert main([str(write_spec(tmp_path / "s.yaml", tmp_path / "logs"))]) == 2
    assert "pip install -e '.[sweep]'" in capsys.readouterr().err


def test_cpu_workers_share_the_cores_and_gpu_workers_get_their_own(monkeypatch) -> None:
    from project.engine.sweep.__main__ import gpu_groups

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert gpu_groups(2) == [None, None]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert gpu_groups(4) == ["0", "1", "2", "3"]
    assert gpu_groups(2) == ["0,1", "2,3"]  # a 2-GPU DDP trial per worker
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    assert gpu_groups(2) == ["4,5", "6,7"]


@pytest.mark.guarantee(
    "a failing trial is marked failed with its error sentence (shown by `make sweep-status`), keeps its directory "
    "and console log, and its worker goes on; 3 in a row stop the worker without a traceback"
)
@pytest.mark.slow
def test_trials_that_fail_are_recorded_with_their_reason_and_the_worker_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A value the CLI parses but the task refuses once its trial builds it (a fraction of the run above 1).
    spec = write_spec(tmp_path / "bad.yaml", tmp_path / "logs", trials=2, params={"model.warmup": {"choices": [1.5]}})
    code, out = finish(sweep(spec))
    assert code == 1 and "Traceback" not in out, out  # the worker gave up after failures in a row, not a crash
    sweep_dir = tmp_path / "logs" / "sweeps" / "bad"
    trials = load(sweep_dir, "bad").get_trials()
    assert len(trials) == 3 and all(t.state == TrialState.FAIL for t in trials)  # FAILURES_IN_A_ROW, none RUNNING
    sentence = "model.warmup=1.5: a fraction of the run must lie in [0, 1)"
    for trial in trials:
        assert sentence in trial.user_attrs["error"]
        assert sentence in (sweep_dir / f"trial_{trial.number}" / "console.log").read_text()  # kept
    assert f"stopping; the last one: error: {sentence}" in out
    assert main([str(spec), "--status"]) == 0
    assert capsys.readouterr().out.count(sentence) >= 3


@pytest.mark.guarantee("a sweep metric the task does not log is refused before anything runs, naming those it logs")
def test_a_metric_the_task_does_not_log_is_refused_before_anything_runs(tmp_path: Path, capsys) -> None:
    spec = write_spec(tmp_path / "s.yaml", tmp_path / "logs", metric="val/rmse", direction="minimize")
    assert main([str(spec)]) == 2
    err = capsys.readouterr().err
    assert "metric='val/rmse': Classifier does not log it; it logs val/acc, val/loss" in err
    assert not (tmp_path / "logs").exists()


PASSWORD = "sweep-secret"


def _postgres_bindir() -> Path | None:
    """Where initdb and pg_ctl are: on PATH, or where pg_config says (Debian keeps them off PATH)."""
    if shutil.which("pg_ctl"):
        return Path(str(shutil.which("pg_ctl"))).parent
    if shutil.which("pg_config"):
        found = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True).stdout.strip()
        if found and (Path(found) / "pg_ctl").is_file():
            return Path(found)
    return None


@pytest.fixture(scope="module")
def postgres() -> Iterator[str]:
    """A real PostgreSQL server on loopback, password login over TCP; its URL. Its data lives in a folder of its
    own under the system's temporary directory (removed after): the server runs as the unprivileged `postgres`
    user when the tests run as root (it refuses root), and pytest's temporary folders are private to their user."""
    pytest.importorskip("psycopg", reason="the sweep-db extra (psycopg) is not installed")
    bindir = _postgres_bindir()
    if bindir is None:
        pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl) on this machine")
    as_server = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    home = Path(tempfile.mkdtemp(prefix="sweep-postgres-"))
    try:
        (home / "password").write_text(PASSWORD)
        if as_server:
            shutil.chown(home, "postgres")
        subprocess.run([*as_server, str(bindir / "initdb"), "-D", str(home / "data"), "-U", "postgres",
                        "--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={home / 'password'}"],
                       check=True, capture_output=True)  # fmt: skip
        port = free_port()
        options = f"-p {port} -k {home} -c listen_addresses=127.0.0.1"
        subprocess.run([*as_server, str(bindir / "pg_ctl"), "-D", str(home / "data"), "-o", options,
                        "-l", str(home / "log"), "-w", "start"], check=True, capture_output=True)  # fmt: skip
        yield f"postgresql://postgres:{PASSWORD}@127.0.0.1:{port}/postgres"
        subprocess.run([*as_server, str(bindir / "pg_ctl"), "-D", str(home / "data"), "-m", "immediate", "stop"],
                       capture_output=True)  # fmt: skip
    finally:
        shutil.rmtree(home, ignore_errors=True)


def new_database(postgres: str, name: str) -> str:
    """A database of its own on the server (Optuna's tables not made yet): its URL."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(postgres, isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        connection.exec_driver_sql(f"CREATE DATABASE {name}")
    engine.dispose()
    return postgres.rsplit("/", 1)[0] + f"/{name}"


@pytest.mark.guarantee(
    "two machines on one PostgreSQL study, one lost mid-trial (its worker and trial SIGKILLed): the other fails its "
    "trial once it stops beating, runs its values again, and finishes exactly the sweep's trials"
)
@pytest.mark.slow
def test_a_lost_machine_costs_one_trial_and_the_other_finishes_the_study(
    postgres: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two checkouts: their own logs, one sweep file but for the run directories; every trial holds after its first
    # validation until its machine's release file exists, so machine B is lost mid-trial, whatever the speed.
    url = new_database(postgres, "lost")  # both machines start at once: both make Optuna's tables (one wins)
    specs = {}
    for machine in ("a", "b"):
        (tmp_path / machine).mkdir()
        spec, logs = tmp_path / machine / "lost.yaml", tmp_path / machine / "logs"
        hold = ["--trainer.callbacks+=probes.Hold", f"--trainer.callbacks.release={tmp_path / f'release_{machine}'}"]
        args = [*yaml.safe_load(write_spec(spec, logs).read_text())["args"], "--trainer.max_epochs=2", *hold]
        specs[machine] = write_spec(spec, logs, trials=3, args=args, storage=url, heartbeat_interval=1,
                                    grace_period=3)  # fmt: skip
    # Each machine a task of scripts/slurm_sweep.sbatch's job array, as sbatch runs it (from the submit directory).
    monkeypatch.setenv("SLURM_SUBMIT_DIR", str(ROOT))
    script = ["bash", str(ROOT / "scripts" / "slurm_sweep.sbatch")]
    a, b = (sweep(specs[machine], command=[*script, str(specs[machine])]) for machine in "ab")
    deadline = time.monotonic() + 300
    while not (tmp_path / "release_b.held-rank0").exists() and b.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert (tmp_path / "release_b.held-rank0").exists(), finish(b, timeout=1)[1]
    os.killpg(b.pid, signal.SIGKILL)  # machine B is lost: its launcher, worker and trial at once
    b.wait()
    (tmp_path / "release_a").touch()
    code, out = finish(a)
    assert code == 0, out

    trials = optuna.load_study(study_name="lost", storage=url).get_trials()
    on_b = [int(p.name.removeprefix("trial_")) for p in (tmp_path / "b" / "logs" / "sweeps" / "lost").glob("trial_*")]
    assert len(on_b) == 1 and trials[on_b[0]].state == TrialState.FAIL  # its run folder stays where it was
    assert f"trial {on_b[0]}: its worker is gone" in out
    retries = [t for t in trials if t.system_attrs.get("failed_trial") == on_b[0]]
    assert len(retries) == 1 and retries[0].params == trials[on_b[0]].params
    assert (tmp_path / "a" / "logs" / "sweeps" / "lost" / f"trial_{retries[0].number}" / "config.yaml").is_file()
    states = [t.state for t in trials]
    assert sum(s in (TrialState.COMPLETE, TrialState.PRUNED) for s in states) == 3 and TrialState.RUNNING not in states
    # The machines proposed different values (each proposal seeded by the trials before it), but for the retry.
    proposed = [tuple(sorted(t.params.items())) for t in trials if "failed_trial" not in t.system_attrs]
    assert len(set(proposed)) == len(proposed)


@pytest.mark.slow
@pytest.mark.guarantee(
    "two machines on one PostgreSQL study, one lost mid-trial (its worker and trial SIGKILLed): the other fails its "
    "trial once it stops beating, runs its values again, and finishes exactly the sweep's trials"
)
def test_the_count_before_a_trial_is_locked_for_every_machine(postgres: str, tmp_path: Path) -> None:
    from project.engine.sweep import spec as sweep_spec
    from project.engine.sweep.study import lock, open_study

    spec = sweep_spec.load(write_spec(tmp_path / "locked.yaml", tmp_path / "logs", storage=postgres))
    # Two machines: each its own storage (its own connections) and its own sweep directory.
    machines = [open_study(spec, tmp_path / name) for name in ("a", "b")]
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    entered = threading.Event()

    def second_machine() -> None:
        with lock(*machines[1], tmp_path / "b"):
            entered.set()

    engine = machines[0][1].engine
    with lock(*machines[0], tmp_path / "a"):
        thread = threading.Thread(target=second_machine)
        thread.start()
        waiting = 0
        deadline = time.monotonic() + 60
        while not waiting and not entered.is_set() and time.monotonic() < deadline:
            with engine.connect() as connection:
                sql = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                waiting = connection.exec_driver_sql(sql).scalar()
            time.sleep(0.05)
        assert waiting == 1 and not entered.is_set()  # machine B waits for machine A's count
    thread.join(timeout=60)
    assert entered.is_set()  # and goes on once A is done


@pytest.mark.guarantee(
    "a sweep database that cannot be used is named in one sentence, password hidden, nothing written"
)
@pytest.mark.parametrize("case", ["wrong password", "nothing listening", "no driver"])
def test_a_database_that_cannot_be_used_is_one_sentence(
    case: str, postgres: str, tmp_path: Path, capsys, monkeypatch
) -> None:
    url = {
        "wrong password": postgres.replace(PASSWORD, "not-the-password"),
        "nothing listening": f"postgresql://postgres:{PASSWORD}@127.0.0.1:{free_port()}/postgres",
        "no driver": postgres,
    }[case]
    if case == "no driver":
        monkeypatch.setitem(sys.modules, "psycopg", None)  # what SQLAlchemy's import sees when it is not installed
    assert main([str(write_spec(tmp_path / "s.yaml", tmp_path / "logs", storage=url))]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "postgresql://postgres:***@127.0.0.1" in err
    assert "not-the-password" not in err and PASSWORD not in err
    assert {"wrong password": "password authentication failed", "nothing listening": "cannot connect",
            "no driver": "make install EXTRAS=sweep-db"}[case] in err  # fmt: skip
    assert not (tmp_path / "logs").exists()


@pytest.mark.guarantee(
    "a trial failed for a stopped heartbeat is said so by the worker that found it, whichever check found it (its "
    "own before counting, or Optuna's before each trial), and its values are queued again"
)
def test_a_stale_trial_found_by_optunas_own_check_is_said_and_queued_again(tmp_path: Path, capsys, monkeypatch) -> None:
    from project.engine.sweep import spec as sweep_spec
    from project.engine.sweep.study import open_study

    url = f"sqlite:///{tmp_path / 'study.db'}"  # a database, so Optuna's heartbeat (no server needed)
    spec = sweep_spec.load(write_spec(tmp_path / "stale.yaml", tmp_path / "logs", storage=url))
    study, store = open_study(spec, tmp_path / "sweep")
    trial = study.ask({"x": optuna.distributions.FloatDistribution(0.0, 1.0)})
    # Its machine lost: the storage finds its heartbeat stale (what a grace period without beats would make it).
    monkeypatch.setattr(store, "_get_stale_trial_ids", lambda study_id: [trial._trial_id])
    optuna.storages.fail_stale_trials(study)  # what Optuna's optimize runs before each trial, outside the worker's
    assert f"trial {trial.number}: its worker is gone" in capsys.readouterr().out
    trials = study.get_trials()
    assert trials[trial.number].state == TrialState.FAIL
    assert [t.params for t in trials if t.state == TrialState.WAITING] == [trials[trial.number].params]
