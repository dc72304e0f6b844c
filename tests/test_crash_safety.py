"""Crashes lose nothing, and loading a checkpoint never runs code from it."""

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import preloaded
import pytest
import torch
from conftest import DEBUG, DIGITS, PYTHONPATH, ROOT, fit, free_port, run_module, scratch_dir
from probes import Crash, CrashAt
from test_resume import _overlay

from project.engine import CLI, AtomicCheckpointIO, BackgroundCheckpointIO, main

# A wide MLP: a ~13 MB checkpoint takes long enough to write that a kill can be aimed into the write.
KILL_RUN = (
    "--model.net=toy.MLP", "--model.net.init_args.hidden=1024", "--trainer.max_epochs=5",
    "--trainer.limit_val_batches=2", "--trainer.limit_test_batches=2",  # 5 epochs x 20 batches = 100 steps
)  # fmt: skip


def _start(*args: str) -> preloaded.Forked:
    """``python -m project fit *args``, forked from an interpreter that has imported the stack (the kills aim at its
    training, not at its imports), in a session of its own (killpg stops or kills it whole)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "MASTER_PORT": str(free_port()),
           "PYTHONPATH": PYTHONPATH}  # fmt: skip
    return preloaded.start("fit", *args, env=env, cwd=scratch_dir(), stdout=os.devnull, stderr=os.devnull)


def _freeze_inside_a_write(proc: preloaded.Forked, run: Path, deadline: float) -> None:
    """Stops ``proc`` (SIGSTOP, then waits until the kernel shows it stopped) while a temp file of last.ckpt exists:
    a write lasts milliseconds, and a kill sent when the file was seen could land after the write's rename (seen in
    CI: a test aimed at a write that killed after it). Stopped, the process cannot finish the write before the kill."""
    while True:
        while not list(run.glob("checkpoints/.last.ckpt.tmp-*")):
            assert proc.poll() is None and time.monotonic() < deadline
            os.sched_yield()  # poll without a delay, but let the run have the CPU
        os.killpg(proc.pid, signal.SIGSTOP)
        while Path(f"/proc/{proc.pid}/stat").read_text().rpartition(")")[2].split()[0] not in ("T", "t"):
            time.sleep(0.001)  # stopped when the kernel says so, not when the signal was sent
        if list(run.glob("checkpoints/.last.ckpt.tmp-*")):
            return  # frozen mid-write
        os.killpg(proc.pid, signal.SIGCONT)  # the write finished first: wait for the next one


@pytest.mark.guarantee(
    "4 SIGKILLs, half aimed inside a checkpoint write: `last.ckpt` always loads, the resumed run equals the "
    "uninterrupted one, no temp file left"
)
@pytest.mark.slow
def test_sigkill_at_random_moments_never_corrupts_last_ckpt_and_resume_is_exact(tmp_path: Path) -> None:
    overlay = _overlay(tmp_path, every_n_train_steps=1, crash=None, workers=0)
    reference = run_module(
        "fit", "--config", DIGITS, "--config", overlay, f"--trainer.logger.init_args.save_dir={tmp_path / 'ref'}",
        *KILL_RUN, forked=True,
    )  # fmt: skip
    assert reference.returncode == 0, reference.stderr[-3000:]
    expected = torch.load(tmp_path / "ref/digits/version_0/checkpoints/last.ckpt", weights_only=True)

    run = tmp_path / "killed" / "digits" / "version_0"
    last = run / "checkpoints" / "last.ckpt"
    chooser, kills, steps = random.Random(0), 0, []
    mid_write = {"atomic": 0, "background": 0}
    # Kills 0-1 with the blocking atomic writer, 2-3 and the final resume with the background writer (its write
    # runs in a thread while training goes on): both feed one chain of resumes, which must end bitwise as above.
    # Each writer is killed once aimed at a write and once after a random delay.
    background = ("--trainer.plugins=project.engine.BackgroundCheckpointIO",)
    while kills < 4:
        writer = "atomic" if kills < 2 else "background"
        flags = background if writer == "background" else ()
        if last.is_file():
            proc = _start("--config", str(run / "config.yaml"), "--ckpt_path", str(last), *flags)
        else:
            proc = _start("--config", DIGITS, "--config", overlay,
                          f"--trainer.logger.init_args.save_dir={tmp_path / 'killed'}", *KILL_RUN)  # fmt: skip
        seen = last.stat().st_mtime_ns if last.is_file() else 0
        aim_at_write = kills % 2 == 0
        deadline = time.monotonic() + 90
        try:
            # Let the process get going: wait for its first checkpoint, then kill it mid-write (as soon as a temp
            # file shows up) or after a random delay.
            # Polled with short sleeps, not a busy loop: on 2 cores a spinning test would slow the run it watches.
            while not (last.is_file() and last.stat().st_mtime_ns != seen):
                assert proc.poll() is None, f"the run ended before it could be killed ({kills} kills, steps {steps})"
                assert time.monotonic() < deadline
                time.sleep(0.01)
            if aim_at_write:
                _freeze_inside_a_write(proc, run, deadline)
            else:
                time.sleep(chooser.uniform(0.0, 0.3))
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        kills += 1
        mid_write[writer] += bool(list(run.glob("checkpoints/.last.ckpt.tmp-*")))
        checkpoint = torch.load(last, weights_only=True)  # never truncated: the old file or the new one
        steps.append(checkpoint["global_step"])

    assert mid_write["atomic"] >= 1 and mid_write["background"] >= 1, f"kills inside a checkpoint write: {mid_write}"
    assert steps == sorted(steps) and steps[-1] < 100, steps  # progress, and the run was not finished
    final = run_module("fit", "--config", str(run / "config.yaml"), "--ckpt_path", str(last), *background, forked=True)
    assert final.returncode == 0, final.stderr[-3000:]
    got = torch.load(last, weights_only=True)
    assert got["global_step"] == expected["global_step"] == 100
    for name, value in expected["state_dict"].items():
        assert torch.equal(got["state_dict"][name], value), f"{name} differs from the uninterrupted run"
    assert not list(run.glob("checkpoints/.*.tmp-*")), "stray temp files were not cleaned up"
    assert [d.name for d in run.parent.iterdir()] == ["version_0"]


@pytest.mark.guarantee("Ctrl-C/SIGTERM save `last.ckpt`, exit 130/143 with the resume command")
@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_saves_a_checkpoint_and_says_how_to_resume(signum: int, tmp_path: Path) -> None:
    save_dir = f"--trainer.logger.init_args.save_dir={tmp_path}"
    stderr = tmp_path / "stderr"
    proc = preloaded.start("fit", "--config", DIGITS, save_dir, cwd=scratch_dir(), stdout=os.devnull, stderr=stderr,
                           env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": PYTHONPATH})  # fmt: skip
    run = tmp_path / "digits" / "version_0"
    deadline = time.monotonic() + 120
    while not (run / "checkpoints" / "last.ckpt").is_file():  # training is under way (end of epoch 0)
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    os.kill(proc.pid, signum)
    proc.wait(timeout=120)
    err = stderr.read_text()
    assert proc.returncode == 128 + signum
    step = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]
    name = signal.Signals(signum).name
    assert f"Interrupted by {name} after step {step}: saved {run}/checkpoints/last.ckpt" in err
    assert f"Resume with: make resume RUN={run}" in err and "Traceback" not in err


@pytest.mark.guarantee(
    "4 SIGKILLs, half aimed inside a checkpoint write: `last.ckpt` always loads, the resumed run equals the "
    "uninterrupted one, no temp file left"
)
def test_atomic_save_replaces_in_the_same_directory_and_never_truncates(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    io, path = AtomicCheckpointIO(), tmp_path / "last.ckpt"
    io.save_checkpoint({"state_dict": {"w": torch.ones(3)}}, path)
    (tmp_path / ".best.ckpt.tmp-999").write_bytes(b"left by a killed writer")

    def dies_mid_write(obj: object, f: object) -> None:
        f.write(b"partial")  # type: ignore[attr-defined]
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", dies_mid_write)
    with pytest.raises(KeyboardInterrupt):
        io.save_checkpoint({"state_dict": {"w": torch.zeros(3)}}, path)
    monkeypatch.undo()
    # The old checkpoint is intact; the partial write sits in a temp file beside it, which the next save removes.
    assert torch.equal(torch.load(path, weights_only=True)["state_dict"]["w"], torch.ones(3))
    assert [p.name for p in tmp_path.glob(".last.ckpt.tmp-*")] == [f".last.ckpt.tmp-{os.getpid()}"]
    io.save_checkpoint({"state_dict": {"w": torch.full((3,), 2.0)}}, path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]
    assert torch.equal(torch.load(path, weights_only=True)["state_dict"]["w"], torch.full((3,), 2.0))


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("trained")
    fit(base, configs=(DIGITS, DEBUG))
    return base / "debug" / "version_0"


@pytest.mark.slow
def test_every_checkpoint_written_loads_with_weights_only(trained_run: Path) -> None:
    for path in sorted((trained_run / "checkpoints").glob("*.ckpt")):
        checkpoint = torch.load(path, weights_only=True)
        assert {"state_dict", "optimizer_states", "lr_schedulers", "loops", "rng_states"} <= checkpoint.keys()
        assert checkpoint["Digits"]["train_loader"] == {"epoch": 0, "batches": 5}


class Payload:
    """Unpickling this would create a file: the proof that code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (Path.write_text, (self.marker, "pwned"))


@pytest.mark.guarantee("a checkpoint carrying code is refused, the code never runs")
@pytest.mark.slow
@pytest.mark.parametrize("subcommand", ["fit", "test"])
def test_a_checkpoint_carrying_code_is_refused_and_the_code_never_runs(
    subcommand: str, trained_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = torch.load(trained_run / "checkpoints" / "last.ckpt", weights_only=True)
    marker = tmp_path / "pwned.txt"
    checkpoint["extra"] = Payload(marker)
    evil = tmp_path / "evil.ckpt"
    torch.save(checkpoint, evil)
    with pytest.raises(SystemExit) as exit_info:
        main([subcommand, "--config", str(trained_run / "config.yaml"), f"--ckpt_path={evil}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "holds Python objects other than tensors and plain data" in err and "Traceback" not in err
    assert not marker.exists()


@pytest.mark.guarantee(
    "missing/truncated/non-torch checkpoints, another architecture, a changed hyperparameter on resume, no run to "
    "resume: one sentence, exit 2"
)
@pytest.mark.slow
def test_bad_checkpoint_inputs_each_get_one_clear_sentence(
    trained_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes((trained_run / "checkpoints" / "last.ckpt").read_bytes()[:5000])
    not_a_checkpoint = tmp_path / "notes.ckpt"
    not_a_checkpoint.write_text("hello")
    cases = {
        str(tmp_path / "missing.ckpt"): "no such checkpoint file",
        str(truncated): "is not a readable checkpoint",
        str(not_a_checkpoint): "is not a readable checkpoint",
    }
    for path, message in cases.items():
        with pytest.raises(SystemExit) as exit_info:
            main(["test", "--config", str(trained_run / "config.yaml"), f"--ckpt_path={path}"])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err


@pytest.mark.slow
def test_a_checkpoint_of_another_architecture_names_the_key_or_the_parameter(
    trained_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = str(trained_run / "checkpoints" / "best.ckpt")
    # Through the config: the checkpoint's hparams disagree with it.
    with pytest.raises(SystemExit) as exit_info:
        main(["test", "--config", DIGITS, "--model.net.init_args.channels=8", f"--ckpt_path={ckpt}"])
    assert exit_info.value.code == 2
    assert "model.net.init_args.channels=32 (config: 8)" in capsys.readouterr().err
    # Without hparams to compare (e.g. a checkpoint from a hand-built model): the shapes name the parameter.
    stripped = torch.load(ckpt, weights_only=True)
    del stripped["hyper_parameters"]
    bare = tmp_path / "bare.ckpt"
    torch.save(stripped, bare)
    with pytest.raises(SystemExit) as exit_info:
        main(["test", "--config", DIGITS, "--model.net.init_args.channels=8", f"--ckpt_path={bare}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "net.layers.0.weight has shape (32, 1, 3, 3) in the checkpoint but (8, 1, 3, 3) here" in err


@pytest.mark.slow
def test_overriding_a_model_hyperparameter_on_resume_is_an_error(
    trained_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(trained_run / "config.yaml"), "--model.optimizer.lr=0.1",
              f"--ckpt_path={trained_run / 'checkpoints' / 'last.ckpt'}"])  # fmt: skip
    assert exit_info.value.code == 2
    assert "was trained with model.optimizer.init_args.lr=0.003 (config: 0.1)" in capsys.readouterr().err


@pytest.mark.slow
def test_make_resume_continues_the_latest_run_and_refuses_when_there_is_none_or_it_ended(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # INSTALLED= : the suite's own environment; a pyproject.toml edited since make install must not reinstall it
    # (pip, unpinned) under the running suite.
    make = ["make", "--no-print-directory", "-s", "-C", str(ROOT), "resume", "INSTALLED="]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": PYTHONPATH}
    empty = subprocess.run([*make, f"RUN={tmp_path / 'nothing'}"], capture_output=True, text=True, env=env)
    assert empty.returncode == 2 and "no run to resume" in empty.stderr

    # A run that dies as its second epoch starts (the crash is injected by hand, so it is not in config.yaml).
    cli = CLI(["--config", DIGITS, "--config", DEBUG, "--trainer.max_epochs=2",
               f"--trainer.logger.init_args.save_dir={tmp_path}"], run=False)  # fmt: skip
    cli.trainer.callbacks.append(CrashAt(epoch=1))
    with pytest.raises(Crash):
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    run = tmp_path / "debug" / "version_0"
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 5
    resumed = subprocess.run([*make, f"RUN={run}"], capture_output=True, text=True, env=env, timeout=240)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "exists and is not empty" not in resumed.stderr  # Lightning's warning: continuing in it is the point
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 10
    assert [d.name for d in run.parent.iterdir()] == ["version_0"]
    # Resumed to its planned end, the run is finished: resuming it again is refused, adding nothing to its record.
    record = (run / "provenance.json").read_text()
    again = subprocess.run([*make, f"RUN={run}"], capture_output=True, text=True, env=env, timeout=240)
    said = f"error: {run} finished its 2 epochs (10 steps): nothing is left to resume. To train it longer, give more"
    assert again.returncode == 2 and said in again.stderr, again.stderr[-2000:]
    assert (run / "provenance.json").read_text() == record
    # One that stopped early would stop again: refused too, pointing at a new run from its weights.
    (run / "provenance.json").write_text(record.replace('"status": "finished"', '"status": "stopped early at epoch 1"'))
    with pytest.raises(SystemExit) as refused:
        main(["fit", "--config", str(run / "config.yaml"), "--ckpt_path", str(run / "checkpoints" / "last.ckpt")])
    assert refused.value.code == 2
    assert "stopped early at epoch 1: resumed, its early stopping would stop it again" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("spelled", ["relative", "absolute"])
def test_resuming_a_run_logged_under_a_relative_path_keeps_one_best_checkpoint(spelled: str, tmp_path: Path) -> None:
    # `make train` logs under "logs" (relative); `make resume` may name the checkpoint either way.
    cli = CLI(["--config", DIGITS, "--config", DEBUG, "--trainer.max_epochs=3",
               "--trainer.logger.init_args.save_dir=logs"], run=False)  # fmt: skip
    cli.trainer.callbacks.append(CrashAt(epoch=2))
    with pytest.raises(Crash):
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    run = Path("logs/debug/version_0")
    last = run / "checkpoints" / "last.ckpt"
    main(
        [
            "fit",
            "--config",
            str(run / "config.yaml"),
            f"--ckpt_path={last.resolve() if spelled == 'absolute' else last}",
        ]
    )
    assert torch.load(last, weights_only=True)["global_step"] == 15
    # The best-checkpoint record survived the resume: no best-v1.ckpt beside best.ckpt.
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["best.ckpt", "last.ckpt"]


class _GatedWriter(AtomicCheckpointIO):
    """The atomic writer, held at its start until the test opens the gate; records what it wrote, in order."""

    def __init__(self) -> None:
        self.gate, self.events = threading.Event(), []

    def save_checkpoint(self, checkpoint: dict, path: object, storage_options: object = None) -> None:
        self.events.append(("start", Path(str(path)).name))
        assert self.gate.wait(timeout=60)
        super().save_checkpoint(checkpoint, path, storage_options)
        self.events.append(("end", Path(str(path)).name))


def test_background_save_snapshots_the_state_and_keeps_one_save_in_flight(tmp_path: Path) -> None:
    io = BackgroundCheckpointIO()
    writer = io._checkpoint_io = _GatedWriter()  # the wrapped writer (Lightning's setter keeps a configured one)
    weights = torch.ones(4)
    io.save_checkpoint({"state_dict": {"w": weights}}, tmp_path / "a.ckpt")  # returns while the write waits
    weights.add_(1.0)  # training goes on and changes the weights in place
    waiting, wait = threading.Event(), io.wait
    io.wait = lambda: (waiting.set(), wait())[1]  # type: ignore[method-assign]  # the second save's first move
    second = threading.Thread(target=io.save_checkpoint, args=({"state_dict": {"w": weights}}, tmp_path / "b.ckpt"))
    second.start()
    assert waiting.wait(timeout=60)  # the second save is under way (an observable state, not a delay) ...
    assert second.is_alive() and writer.events == [("start", "a.ckpt")]  # ... and waits for the first
    writer.gate.set()
    second.join(timeout=60)
    io.teardown()  # the end of fit: everything is on disk
    assert writer.events == [("start", "a.ckpt"), ("end", "a.ckpt"), ("start", "b.ckpt"), ("end", "b.ckpt")]
    assert torch.equal(torch.load(tmp_path / "a.ckpt", weights_only=True)["state_dict"]["w"], torch.ones(4))
    assert torch.equal(torch.load(tmp_path / "b.ckpt", weights_only=True)["state_dict"]["w"], torch.full((4,), 2.0))


def test_a_failed_background_write_is_raised_on_the_training_thread(tmp_path: Path) -> None:
    io = BackgroundCheckpointIO()
    io.save_checkpoint({"state_dict": {"w": torch.ones(2)}}, tmp_path / "missing" / "x" / "a.ckpt")
    (tmp_path / "blocker").write_text("a file where a directory should be")
    io.save_checkpoint({"state_dict": {"w": torch.ones(2)}}, tmp_path / "blocker" / "b.ckpt")
    with pytest.raises(FileExistsError):  # at the next save (which then does not happen: the fit stops there)...
        io.save_checkpoint({"state_dict": {"w": torch.ones(2)}}, tmp_path / "c.ckpt")
    io.save_checkpoint({"state_dict": {"w": torch.ones(2)}}, tmp_path / "c.ckpt")
    io.save_checkpoint({"state_dict": {"w": torch.ones(2)}}, tmp_path / "blocker" / "d.ckpt")
    with pytest.raises(FileExistsError):  # ...or at the end of fit
        io.teardown()
    assert (tmp_path / "missing" / "x" / "a.ckpt").is_file() and (tmp_path / "c.ckpt").is_file()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 40 MB filesystem (tmpfs), as root; skipped with the reason where mounting is not allowed."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", str(disk)], capture_output=True,
                             text=True)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


@pytest.mark.guarantee(
    "a disk that fills up during a run (a real tmpfs): one sentence, exit 1, `last.ckpt`/`best.ckpt` whole and no "
    "temp file, then `make resume` ends bitwise equal to the uninterrupted run; blocking and background writers"
)
@pytest.mark.slow
@pytest.mark.parametrize("writer", ["atomic", "background"])
def test_a_full_disk_stops_the_run_in_one_sentence_keeps_its_checkpoints_and_resumes_exactly(
    writer: str, small_disk: Path, tmp_path: Path, one_thread: None
) -> None:
    run_args = ("--trainer.max_epochs=3", "--trainer.limit_train_batches=5", "--trainer.limit_val_batches=2",
                "--trainer.limit_test_batches=2", "--trainer.enable_progress_bar=false",
                *(["--trainer.plugins=project.engine.BackgroundCheckpointIO"] if writer == "background"
                  else []))  # fmt: skip
    straight = fit(tmp_path / "straight", *run_args)
    filler = small_disk / "filler"
    # The disk fills up as epoch 1's checkpoints are about to be written (the background writer reports its failed
    # write at the next save: epoch 1's last.ckpt, which is then not written either).
    failed = run_module("fit", "--config", DIGITS, *run_args, f"--trainer.logger.init_args.save_dir={small_disk}",
                        "--trainer.callbacks+=probes.FillDisk", f"--trainer.callbacks.path={filler}",
                        f"--trainer.callbacks.done={tmp_path / 'filled'}", forked=True)  # fmt: skip
    assert failed.returncode == 1, failed.stderr[-3000:]
    error = [line for line in failed.stderr.splitlines() if line.startswith("error: ")]
    assert len(error) == 1 and "could not write the checkpoint" in error[0] and "no space left" in error[0], error
    assert "Traceback" not in failed.stderr, failed.stderr[-4000:]
    checkpoints = small_disk / "digits" / "version_0" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["best.ckpt", "last.ckpt"]  # no temp file left
    assert torch.load(checkpoints / "last.ckpt", weights_only=True)["epoch"] == 0  # epoch 0's, whole
    torch.load(checkpoints / "best.ckpt", weights_only=True)
    filler.unlink()  # space freed: make resume continues the run to the same weights as the uninterrupted one
    run = checkpoints.parent
    fit(small_disk, "--ckpt_path", str(checkpoints / "last.ckpt"), configs=(str(run / "config.yaml"),))
    expected = torch.load(Path(straight.trainer.log_dir) / "checkpoints" / "last.ckpt", weights_only=True)
    got = torch.load(checkpoints / "last.ckpt", weights_only=True)
    assert got["global_step"] == expected["global_step"] == 15
    for name, value in expected["state_dict"].items():
        assert torch.equal(got["state_dict"][name], value), name


@pytest.mark.guarantee(
    "a DataLoader worker SIGKILLed mid-run (for real): the run stops at the next step boundary with `last.ckpt` "
    "saved and one sentence naming the worker's pid, exit 1, provenance says so, then `make resume` ends bitwise "
    "equal to the uninterrupted run; the loader's own report of a dead worker gets the sentence too"
)
@pytest.mark.slow
def test_a_killed_loader_worker_stops_the_run_at_a_step_boundary_with_a_checkpoint_and_it_resumes_exactly(
    tmp_path: Path, one_thread: None
) -> None:
    # The out-of-memory killer's SIGKILL, for real, to a worker of the run's validation loader (2 workers per
    # loader, kept across epochs) while the run holds at epoch 1's start. Unlike a train worker, it owes the
    # training no batch, so the run goes on until its next step boundary, where it must stop with last.ckpt saved
    # rather than be torn down by torch's SIGCHLD handler wherever it is (mid optimizer step included).
    release = tmp_path / "release"
    run_args = ("--trainer.max_epochs=2", "--trainer.limit_train_batches=5", "--trainer.limit_val_batches=2",
                "--trainer.limit_test_batches=2", "--data.num_workers=2", "--trainer.callbacks+=probes.Hold",
                f"--trainer.callbacks.release={release}")  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": PYTHONPATH}
    proc = subprocess.Popen(
        [sys.executable, "-m", "project", "fit", "--config", DIGITS, *run_args,
         f"--trainer.logger.init_args.save_dir={tmp_path / 'killed'}"],
        cwd=scratch_dir(), env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
        start_new_session=True,
    )  # fmt: skip
    held = Path(f"{release}.held-rank0")
    try:
        deadline = time.monotonic() + 120
        while not held.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.05)
        workers = json.loads(held.read_text())
        assert len(workers["train"]) == len(workers["val"]) == 2, workers
        os.kill(workers["val"][0], signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    run = tmp_path / "killed" / "digits" / "version_0"
    assert proc.returncode == 1, err[-3000:]
    assert (f"error: a DataLoader worker (pid {workers['val'][0]}) was killed by a signal (Killed): most often the "
            "out-of-memory killer") in err  # fmt: skip
    assert (f"The run stopped after step 6 with {run}/checkpoints/last.ckpt saved; continue it: make resume "
            f"RUN={run}") in err and "Traceback" not in err  # fmt: skip
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 6  # epoch 1's first
    (segment,) = json.loads((run / "provenance.json").read_text())["segments"]
    assert segment["status"] == "stopped at step 6: a DataLoader worker died"

    release.touch()  # as `make resume RUN=<run>` runs it, then the same run uninterrupted: bitwise equal
    resumed = fit(tmp_path / "killed", "--ckpt_path", str(run / "checkpoints" / "last.ckpt"),
                  configs=(str(run / "config.yaml"),))  # fmt: skip
    straight = fit(tmp_path / "straight", *run_args)
    assert resumed.trainer.global_step == straight.trainer.global_step == 10
    final = [torch.load(r / "digits" / "version_0" / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
             for r in (tmp_path / "killed", tmp_path / "straight")]  # fmt: skip
    for name, value in final[1].items():
        assert torch.equal(final[0][name], value), name


@pytest.mark.guarantee(
    "a DataLoader worker SIGKILLed mid-run (for real): the run stops at the next step boundary with `last.ckpt` "
    "saved and one sentence naming the worker's pid, exit 1, provenance says so, then `make resume` ends bitwise "
    "equal to the uninterrupted run; the loader's own report of a dead worker gets the sentence too"
)
def test_a_dead_loader_worker_is_named_in_one_sentence_however_torch_reports_it() -> None:
    # The loader's own report, when the next batch was the dead worker's to load (between two steps).
    from project.engine.run.faults import worker_fault

    fault = worker_fault(RuntimeError("DataLoader worker (pid(s) 4242, 4243) exited unexpectedly"))
    assert fault is not None and fault.startswith("a DataLoader worker (pid 4242, 4243) exited unexpectedly: ")
    assert "The checkpoints already written are whole; continue it: make resume" in fault
    assert worker_fault(RuntimeError("CUDA out of memory")) is None  # any other error keeps its traceback
