"""Trackers against the real thing: a real MLflow tracking server (SQLite, loopback, a free port) that a run, its
resume after a crash and a 2-trial sweep log to, read back with MLflow's client; W&B offline, read back from the
run files it writes; and the overlays refused in one sentence when their extra cannot be imported."""

import json
import os
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from conftest import DIGITS, PYTHONPATH, ROOT, fit, free_port, scalars, scratch_dir, wait_or_kill
from probes import Crash

MLFLOW = str(ROOT / "configs" / "loggers" / "mlflow.yaml")
# make test needs no tracker extras; the template's CI installs both (make install EXTRAS=mlflow,wandb).
NOT_INSTALLED = "the {0} extra is not installed (make install EXTRAS={0})"
WANDB = str(ROOT / "configs" / "loggers" / "wandb.yaml")
# 3 epochs of 5 steps; a crash as step 12 starts, after last.ckpt at the end of epoch 1 (step 10): the crashed
# process has logged steps 10 and 11, which the resumed one logs again.
SHORT = ("--trainer.max_epochs=3", "--trainer.limit_train_batches=5", "--trainer.limit_val_batches=2",
         "--trainer.limit_test_batches=2", "--trainer.log_every_n_steps=1", "--trainer.enable_progress_bar=false",
         "--model.net=toy.MLP")  # fmt: skip
CRASH = ("--trainer.callbacks+=probes.CrashAt", "--trainer.callbacks.step=12")


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``mlflow server`` as `make mlflow` starts it, on a free loopback port; its URI once /health answers."""
    pytest.importorskip("mlflow", reason=NOT_INSTALLED.format("mlflow"))
    base, port = tmp_path_factory.mktemp("mlflow"), free_port()
    with open(base / "server.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{base / 'mlflow.db'}",
             "--artifacts-destination", str(base / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
             "--workers", "1"],
            cwd=base, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},  # as make mlflow
        )  # fmt: skip
        uri, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 120  # a bound on a hung start, not a wait
        while not _answers(f"{uri}/health"):
            if proc.poll() is not None or time.monotonic() > deadline:
                os.killpg(proc.pid, signal.SIGKILL)
                pytest.fail(f"the MLflow server did not start: {(base / 'server.log').read_text()[-3000:]}")
            time.sleep(0.2)  # between polls, the CPU is the starting server's
        yield uri
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


def _answers(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status == 200
    except OSError:
        return False


def _crash_then_resume(save_dir: Path, *configs: str, args: tuple[str, ...] = ()) -> Path:
    """A run that crashes past its last checkpoint, then `make resume`'s fit of it; its run directory."""
    with pytest.raises(Crash):
        fit(save_dir, *SHORT, *args, *CRASH, configs=(DIGITS, *configs))
    run = save_dir / "digits" / "version_0"
    fit(save_dir, "--ckpt_path", str(run / "checkpoints" / "last.ckpt"), "--trainer.callbacks.step=null",
        configs=(str(run / "config.yaml"),))  # fmt: skip
    return run


@pytest.mark.slow
@pytest.mark.minimum  # the mlflow extra's bound: make test-minimum runs it
def test_a_run_and_its_resume_are_one_mlflow_run_with_every_step_once(
    mlflow_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    run = _crash_then_resume(tmp_path / "logs", MLFLOW, args=("--trackers.log_model=true",))
    client = MlflowClient(mlflow_server)
    experiment = client.get_experiment_by_name("digits")  # the run's experiment name
    runs = client.search_runs([experiment.experiment_id])
    recorded = json.loads((run / "trackers.json").read_text())["MLFlowLogger"]
    assert [r.info.run_id for r in runs] == [recorded["run_id"]]  # the resume continued it: one run
    mlflow_run = runs[0]
    assert mlflow_run.info.run_name == "digits/version_0" and mlflow_run.info.status == "FINISHED"

    # Every step once, with the values the resumed run logged (TensorBoard purges the crashed process's).
    history = [(m.step, m.value) for m in client.get_metric_history(mlflow_run.info.run_id, "train/loss")]
    expected = scalars(run)["train/loss"]
    assert [s for s, _ in history] == list(range(15)) == [s for s, _ in expected]
    assert [v for _, v in history] == pytest.approx([v for _, v in expected], rel=1e-6)
    assert [m.step for m in client.get_metric_history(mlflow_run.info.run_id, "val/acc")] == [4, 9, 14]
    assert "test/acc" in mlflow_run.data.metrics and "hp/val_acc" in mlflow_run.data.metrics

    params = mlflow_run.data.params  # the flattened resolved config
    assert params["model.optimizer.init_args.lr"] == "0.003" and params["data.batch_size"] == "64"
    assert params["model.net.class_path"] == "toy.MLP" and params["trainer.max_epochs"] == "3"
    provenance = json.loads((run / "provenance.json").read_text())["segments"]
    tags = mlflow_run.data.tags
    assert (
        tags["git.commit"] == str(provenance[-1]["git"]["commit"]) and tags["host"] == provenance[-1]["machine"]["host"]
    )
    assert tags["versions.torch"] == provenance[-1]["versions"]["torch"] and "git.dirty" in tags
    assert tags["segment"] == "1" and tags["run_dir"] == str(run)

    assert {a.path for a in client.list_artifacts(mlflow_run.info.run_id)} >= {"config.yaml", "provenance.json", "best"}
    assert [a.path for a in client.list_artifacts(mlflow_run.info.run_id, "best")].count("best/best.ckpt") == 1
    uploaded = client.download_artifacts(mlflow_run.info.run_id, "provenance.json", str(tmp_path))
    assert len(json.loads(Path(uploaded).read_text())["segments"]) == 2  # as the resumed run ended


@pytest.mark.slow
def test_a_sweep_puts_its_trials_in_one_experiment_named_after_the_study(mlflow_server: str, tmp_path: Path) -> None:
    import optuna
    from mlflow.tracking import MlflowClient
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    logs = tmp_path / "logs"
    spec = {
        "configs": [DIGITS, MLFLOW],
        "args": [f"--trainer.logger.init_args.save_dir={logs}", "--trainer.max_epochs=1", *SHORT[1:]],
        "trials": 2,
        "sampler": {"class_path": "optuna.samplers.RandomSampler", "init_args": {"seed": 0}},
        "params": {"model.optimizer.init_args.lr": {"low": 1.0e-3, "high": 1.0e-2}},
    }
    (tmp_path / "trackedsweep.yaml").write_text(yaml.safe_dump(spec))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "PYTHONPATH": PYTHONPATH,
           "MLFLOW_TRACKING_URI": mlflow_server}  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "project.engine.sweep", str(tmp_path / "trackedsweep.yaml")], cwd=scratch_dir(),
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    out, _ = wait_or_kill(proc, 400, "the sweep")
    assert proc.returncode == 0, out

    storage = JournalStorage(JournalFileBackend(str(logs / "sweeps" / "trackedsweep" / "study.journal")))
    trials = {t.number: t for t in optuna.load_study(study_name="trackedsweep", storage=storage).get_trials()}
    client = MlflowClient(mlflow_server)
    experiment = client.get_experiment_by_name("trackedsweep")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 2
    for mlflow_run in runs:
        tags, number = mlflow_run.data.tags, int(mlflow_run.data.tags["sweep.trial"])
        assert tags["sweep.study"] == "trackedsweep" and mlflow_run.info.run_name == f"trackedsweep/trial_{number}"
        assert float(tags["sweep.model.optimizer.init_args.lr"]) == pytest.approx(
            trials[number].params["model.optimizer.init_args.lr"]
        )
        assert float(mlflow_run.data.params["model.optimizer.init_args.lr"]) == pytest.approx(
            trials[number].params["model.optimizer.init_args.lr"]
        )
    assert sorted(int(r.data.tags["sweep.trial"]) for r in runs) == sorted(trials)


def _wandb_records(path: Path) -> Iterator[object]:
    """The records of a ``.wandb`` run file, parsed with the wandb package's own protobuf ``Record`` (the
    package ships no reader since its Go core took over: the file is a LevelDB-style log of 32 KiB blocks,
    each record behind a 7-byte header: checksum, length, type; full=1, first=2, middle=3, last=4)."""
    from wandb.proto import wandb_internal_pb2

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    position, chunk = 7, b""
    while position + 7 <= len(data):
        if block - position % block < 7:  # a block's tail too short for a header is padding
            position += block - position % block
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        chunk += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunk)
            chunk = b""
            yield record


def _items(items: object) -> dict[str, object]:
    """A record's items by key (W&B splits a key with slashes, ``train/loss``, into its nested_key)."""
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}  # type: ignore[attr-defined]


@pytest.mark.slow
def test_a_run_and_its_resume_are_one_wandb_run_offline_with_every_step_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wandb = pytest.importorskip("wandb", reason=NOT_INSTALLED.format("wandb"))
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home"))  # nothing written outside tmp_path
    monkeypatch.setenv("WANDB_SILENT", "true")
    with pytest.raises(Crash):
        fit(tmp_path / "logs", *SHORT, *CRASH, configs=(DIGITS, WANDB))
    wandb.finish(exit_code=1)  # what the crashed process's exit does; this test runs both segments in one process
    run = tmp_path / "logs" / "digits" / "version_0"
    fit(tmp_path / "logs", "--ckpt_path", str(run / "checkpoints" / "last.ckpt"), "--trainer.callbacks.step=null",
        configs=(str(run / "config.yaml"),))  # fmt: skip
    wandb.finish()
    wandb.teardown()  # the service process exits once it has written the run files, as at a process's exit

    run_id = json.loads((run / "trackers.json").read_text())["WandbLogger"]["id"]
    segments = sorted((tmp_path / "logs" / "wandb").glob("offline-run-*"))
    assert len(segments) == 2 and all(s.name.endswith(f"-{run_id}") for s in segments)  # one W&B run, resumed
    steps, config, summary = [], {}, {}
    for segment in segments:
        assert (segment / "files" / "version_0" / "config.yaml").is_file()  # the run's config, as a file
        assert (segment / "files" / "version_0" / "provenance.json").is_file()
        for record in _wandb_records(segment / f"run-{run_id}.wandb"):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                assert record.run.run_id == run_id and record.run.project == "digits"
            elif kind == "config":
                config.update(_items(record.config.update))
            elif kind == "summary":
                summary.update(_items(record.summary.update))
            elif kind == "history":
                items = _items(record.history.item)
                if "train/loss" in items:
                    steps.append((items["trainer/global_step"], items["train/loss"]))
    expected = scalars(run)["train/loss"]
    assert [s for s, _ in steps] == list(range(15)) == [s for s, _ in expected]  # every step once
    assert [v for _, v in steps] == pytest.approx([v for _, v in expected], rel=1e-6)
    assert config["model.optimizer.init_args.lr"] == 0.003 and config["model.net.class_path"] == "toy.MLP"  # the config
    provenance = json.loads((run / "provenance.json").read_text())["segments"][-1]
    assert config["tags/git.commit"] == provenance["git"]["commit"] and config["tags/segment"] == 1
    assert "test/acc" in summary and summary["trainer/global_step"] == 15


@pytest.mark.slow
@pytest.mark.parametrize(("overlay", "package"), [(MLFLOW, "mlflow"), (WANDB, "wandb")])
def test_an_overlay_without_its_extra_is_refused_in_one_sentence(tmp_path: Path, overlay: str, package: str) -> None:
    """The package cannot import (a stand-in that raises ImportError, as if the extra were not installed)."""
    stub = tmp_path / "without" / package
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text(f"raise ImportError('No module named {package}')\n")
    cwd = scratch_dir()
    result = subprocess.run(
        [sys.executable, "-m", "project", "fit", "--config", DIGITS, "--config", overlay],
        cwd=cwd, env={**os.environ, "PYTHONPATH": f"{tmp_path / 'without'}{os.pathsep}{PYTHONPATH}"},
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-3000:]
    logger = {"mlflow": "MLFlowLogger", "wandb": "WandbLogger"}[package]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert (
        errors
        == [
            f"error: trackers={logger} needs the {package} extra: pip install -e '.[{package}]' (or make install "
            f"EXTRAS={package})."
        ]
        and "Traceback" not in result.stderr
    ), result.stderr[-3000:]
    assert not any(cwd.iterdir())  # no run directory
