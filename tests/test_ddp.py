"""Real DDP: 2 processes over gloo on loopback, launched by Lightning from the CLI in a subprocess, compared with
one process on the same global batch (and with closed forms for the sample order and the LR)."""

import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from conftest import DIGITS, PYTHONPATH, ROOT, fit, free_port, run_module, run_ranks, scalars, scratch_dir
from test_mechanics import expected_lr
from toy import Classifier, ConvNet

# Odd-sized val and test splits (ceil(1797 * 0.105) = 189 each), so 2 ranks get 95 + 94 samples: a padding
# sampler would evaluate one sample twice. 1797 - 2 * 189 = 1419 training samples.
COMMON = (
    "--trainer.max_epochs=2",
    "--trainer.accelerator=cpu",
    "--data.drop_last=true",
    "--data.val_fraction=0.105",
    "--data.test_fraction=0.105",
    "--data.eval_samples=151",  # of each 189: an evaluated sample, odd too (76 + 75 on 2 ranks)
    "--model.net.init_args.dropout=0.0",  # dropout draws differ per rank; the equivalence is about the data path
    # float64: the processes sum gradients in another order than one process's batch mean, exact in real
    # arithmetic; in float32 that rounding (6e-8) grew to ~1e-6 weight differences over the 88 AdamW steps, in
    # float64 (1.1e-16) it stays ~1e-14, so the runs can be held to ATOL below.
    "--trainer.precision=64-true",
    "--trainer.callbacks+=probes.Recorder",
)
SEED, N_TRAIN, GLOBAL_BATCH, STEPS_PER_EPOCH = 42, 1419, 32, 1419 // 32  # 44 full global batches per epoch
# Weights of two float64 runs that differ only in summation order: ~100x the run's rounding amplification (~40,
# measured in the accumulation test) times float64's unit roundoff, with a factor > 10^3 to spare; a real
# difference (a sample missed or seen twice, a wrong LR step) moves weights by >= 1e-5.
ATOL = 1e-10


def _permutation(epoch: int) -> list[int]:
    """torch's DistributedSampler order for (seed, epoch), whatever the number of processes."""
    return torch.randperm(N_TRAIN, generator=torch.Generator().manual_seed(SEED + epoch)).tolist()


def _eval_by_hand(checkpoint: Path, images: torch.Tensor, labels: torch.Tensor) -> tuple[float, float, float]:
    """(accuracy, loss, the loss's standard error) over the 151 samples evenly spaced over the split, by hand."""
    picked = [i * len(labels) // 151 for i in range(151)]  # i * 189 // 151: the closed form of "evenly spaced"
    images, labels = images[picked], labels[picked]
    model = Classifier.load_from_checkpoint(checkpoint, weights_only=True).double().eval()  # as the run (64-true)
    with torch.no_grad():
        logits = model(images.double())
    losses = F.cross_entropy(logits, labels, reduction="none")
    se = losses.std() / math.sqrt(len(losses))  # the sample standard deviation (n - 1) over sqrt(n)
    return (logits.argmax(-1) == labels).float().mean().item(), losses.mean().item(), se.item()


def _stopping_at_the_last_epoch(base: Path) -> str:
    """An overlay whose EarlyStopping decides to stop after epoch 1, the run's last anyway: patience 1 and a
    min_delta no accuracy can beat. A real decision, taken on every rank, that leaves the run as it was."""
    callbacks = yaml.safe_load(Path(DIGITS).read_text())["trainer"]["callbacks"]
    for callback in callbacks:
        if callback["class_path"].endswith("TaskEarlyStopping"):
            callback["init_args"].update(patience=1, min_delta=1.0)
    overlay = base / "stopping.yaml"
    overlay.write_text(yaml.safe_dump({"trainer": {"callbacks": callbacks}}))
    return str(overlay)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    base = tmp_path_factory.mktemp("ddp")
    result = run_module(
        "fit", "--config", DIGITS, "--config", str(ROOT / "configs" / "ddp.yaml"),
        "--config", _stopping_at_the_last_epoch(base),
        # "ddp" as a class with a short process-group timeout: a collective that never completes fails in 60 s.
        "--trainer.strategy=lightning.pytorch.strategies.DDPStrategy", "--trainer.strategy.timeout=0:01:00",
        f"--trainer.logger.init_args.save_dir={base / 'ddp'}", "--data.batch_size=16", *COMMON,
        f"--trainer.callbacks.out_dir={base / 'ddp-records'}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    single = fit(
        base / "single",
        f"--data.batch_size={GLOBAL_BATCH}",
        *COMMON,
        f"--trainer.callbacks.out_dir={base / 'single-records'}",
    )
    return {
        "ranks": [torch.load(base / "ddp-records" / f"rank{r}.pt", weights_only=True) for r in (0, 1)],
        "single": torch.load(base / "single-records" / "rank0.pt", weights_only=True),
        "ddp_dir": base / "ddp",
        "stdout": result.stdout,
        "log": result.stdout + result.stderr,
        "datamodule": single.datamodule,
    }


@pytest.mark.guarantee("DDP ranks train on disjoint shards of the (seed, epoch) permutation, reshuffled each epoch")
@pytest.mark.slow
def test_each_rank_trains_on_its_exact_shard_of_the_seeded_permutation(runs: dict) -> None:
    r0, r1 = runs["ranks"]
    assert r0["world_size"] == r1["world_size"] == 2
    assert len(r0["batches"]) == len(r1["batches"]) == 2 * STEPS_PER_EPOCH
    for epoch in range(2):
        # The closed form of the sampler: the (seed + epoch) permutation, tail dropped to an even length, rank r
        # takes every second index from r, in batches of 16.
        perm = _permutation(epoch)[: N_TRAIN - N_TRAIN % 2]
        for rank, record in enumerate((r0, r1)):
            got = [i for b in record["batches"][epoch * STEPS_PER_EPOCH : (epoch + 1) * STEPS_PER_EPOCH] for i in b]
            assert got == perm[rank::2][: STEPS_PER_EPOCH * 16], f"rank {rank} epoch {epoch}"
        shard0 = {i for b in r0["batches"][epoch * STEPS_PER_EPOCH : (epoch + 1) * STEPS_PER_EPOCH] for i in b}
        shard1 = {i for b in r1["batches"][epoch * STEPS_PER_EPOCH : (epoch + 1) * STEPS_PER_EPOCH] for i in b}
        assert not shard0 & shard1  # disjoint
        assert len(shard0 | shard1) >= N_TRAIN - GLOBAL_BATCH  # the whole set, minus at most the dropped tail
    assert r0["batches"][0] != r0["batches"][STEPS_PER_EPOCH]  # set_epoch reshuffles each epoch


@pytest.mark.guarantee("1 process and 2 processes see the same global batches in the same order")
@pytest.mark.slow
def test_one_process_sees_the_same_global_batches_in_the_same_order(runs: dict) -> None:
    (r0, r1), single = runs["ranks"], runs["single"]
    assert len(single["batches"]) == len(r0["batches"])
    for step, (b, b0, b1) in enumerate(zip(single["batches"], r0["batches"], r1["batches"], strict=True)):
        assert sorted(b) == sorted(b0 + b1), f"global batch {step}"
    epoch0 = _permutation(0)
    assert single["batches"][1] == epoch0[GLOBAL_BATCH : 2 * GLOBAL_BATCH]


@pytest.mark.guarantee("... and on 2 DDP processes")
@pytest.mark.slow
def test_lr_schedule_on_two_processes_is_the_closed_form(runs: dict) -> None:
    total = 2 * STEPS_PER_EPOCH
    warmup = math.ceil(0.05 * total)
    for record in (*runs["ranks"], runs["single"]):
        assert record["total_steps"] == record["global_step"] == total
        expected = [expected_lr(s, warmup, total) for s in range(total)]
        assert [groups[0] for groups in record["lrs"]] == pytest.approx(expected, rel=1e-9)


@pytest.mark.guarantee("DDP 2 x B ends with the same weights as 1 x 2B (float64, to 1e-10)")
@pytest.mark.slow
def test_ddp_weights_equal_one_process_on_the_combined_batch(runs: dict) -> None:
    (r0, r1), single = runs["ranks"], runs["single"]
    for name, value in single["final_state"].items():
        assert torch.equal(r0["final_state"][name], r1["final_state"][name]), f"replicas diverged at {name}"
        torch.testing.assert_close(r0["final_state"][name], value, rtol=0, atol=ATOL, msg=name)


@pytest.mark.guarantee(
    "DDP val/test metrics are exact on odd-sized evaluated samples (no padded duplicates): data.eval_samples of "
    "each split, evenly spaced, the loss's standard error beside it"
)
@pytest.mark.slow
def test_ddp_evaluation_is_exact_on_odd_sized_splits(runs: dict) -> None:
    dm, run = runs["datamodule"], runs["ddp_dir"] / "digits" / "version_0"
    assert (len(dm.val_set), len(dm.test_set)) == (189, 189)
    logged = scalars(run)
    # The last validation ran on the weights saved in last.ckpt; the test after fit on best.ckpt. The loss and its
    # error in float32 (the metric's sums) from float64 logits: rel 1e-5 is ~100x float32's rounding of 151 terms.
    val_acc, val_loss, val_se = _eval_by_hand(run / "checkpoints" / "last.ckpt", *dm.split_tensors("val"))
    assert logged["val/acc"][-1][1] == pytest.approx(val_acc, abs=1e-7)
    assert logged["val/loss"][-1][1] == pytest.approx(val_loss, rel=1e-5)
    assert logged["val/loss_se"][-1][1] == pytest.approx(val_se, rel=1e-4)
    test_acc, test_loss, test_se = _eval_by_hand(run / "checkpoints" / "best.ckpt", *dm.split_tensors("test"))
    assert logged["test/acc"][-1][1] == pytest.approx(test_acc, abs=1e-7)
    assert logged["test/loss"][-1][1] == pytest.approx(test_loss, rel=1e-5)
    assert logged["test/loss_se"][-1][1] == pytest.approx(test_se, rel=1e-4)


@pytest.mark.guarantee(
    "EarlyStopping really decides under DDP (it stops the run after epoch 1 on both ranks, with the same wait "
    "count and best score) and ModelCheckpoint agrees on all ranks; only rank 0 writes: one run directory, the "
    "checkpoints and one provenance record, by rank 0's process"
)
@pytest.mark.slow
def test_callback_decisions_agree_on_all_ranks_and_only_rank_zero_writes(runs: dict) -> None:
    r0, r1 = runs["ranks"]
    assert r0["stopper"] == r1["stopper"] and r0["stopper"][0] == 1  # EarlyStopping's wait count, best score
    assert r0["should_stop"] is r1["should_stop"] is True  # it decided, the same on both ranks
    assert r0["best_score"] == r1["best_score"]  # ModelCheckpoint's best val/acc
    assert [d.name for d in (runs["ddp_dir"] / "digits").iterdir()] == ["version_0"]
    run = runs["ddp_dir"] / "digits" / "version_0"
    (segment,) = json.loads((run / "provenance.json").read_text())["segments"]  # one record, by rank 0
    assert segment["pid"] == r0["pid"] != r1["pid"] and segment["status"] == "stopped early at epoch 1"
    assert r0["writes_provenance"] and not r1["writes_provenance"]  # rank 1 has no record to write
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["best.ckpt", "last.ckpt"]
    assert runs["stdout"].count("Test of ") == 1  # the summary line is printed by rank 0 only
    # configs/ddp.yaml (launched by Lightning itself): two members, saved in the run's config.
    assert "MEMBER: 2/2" in runs["log"]
    assert yaml.safe_load((run / "config.yaml").read_text())["trainer"]["devices"] == 2


@pytest.mark.guarantee("a DDP run resumed mid-epoch ends bitwise equal to the uninterrupted one")
@pytest.mark.slow
def test_ddp_resume_from_mid_epoch_equals_the_uninterrupted_run(tmp_path: Path) -> None:
    from test_resume import RUN, _overlay

    # Ranks forked as torchrun starts them (run_ranks): what resume does under DDP is the subject here, how
    # Lightning's launcher starts the ranks is the `runs` fixture's (and torchrun's and SLURM's below).
    ddp = ("--config", str(ROOT / "configs" / "ddp.yaml"), "--trainer.accelerator=cpu", "--data.batch_size=16")
    plain, crashing = _overlay(tmp_path, 4, None, 0), _overlay(tmp_path, 4, {"step": 15}, 0)
    straight = run_ranks("fit", "--config", DIGITS, *ddp, *RUN, "--config", plain,
                         f"--trainer.logger.init_args.save_dir={tmp_path / 'a'}", cwd=scratch_dir())  # fmt: skip
    assert straight.returncode == 0, straight.stderr[-3000:]
    crashed = run_ranks("fit", "--config", DIGITS, *ddp, *RUN, "--config", crashing,
                        f"--trainer.logger.init_args.save_dir={tmp_path / 'b'}", cwd=scratch_dir())  # fmt: skip
    assert crashed.returncode != 0 and "simulated crash" in crashed.stderr
    run = tmp_path / "b" / "digits" / "version_0"
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 12  # mid epoch 1
    resumed = run_ranks("fit", "--config", str(run / "config.yaml"), "--config", plain,
                        "--ckpt_path", str(run / "checkpoints/last.ckpt"), cwd=scratch_dir())  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    expected = torch.load(tmp_path / "a/digits/version_0/checkpoints/last.ckpt", weights_only=True)["state_dict"]
    got = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    for name, value in expected.items():
        assert torch.equal(got[name], value), f"{name} differs after a DDP resume"
    assert scalars(run)["train/loss"] == scalars(tmp_path / "a/digits/version_0")["train/loss"]


def _two_launches(envs: list[dict[str, str]], args: list[str], logs: Path, timeout: float = 240) -> list[str]:
    """Two processes started side by side (two "nodes" on loopback), their output in files (a full pipe would
    block a rank inside a collective); both killed if either hangs. Returns their outputs; asserts exit 0."""
    base = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONWARNINGS": "ignore",
        "PYTHONPATH": PYTHONPATH,
    }
    logs.mkdir(parents=True, exist_ok=True)
    files = [open(logs / f"node{i}.log", "w+") for i in range(len(envs))]  # noqa: SIM115
    procs = [
        subprocess.Popen(
            args, cwd=scratch_dir(), env={**base, **env}, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
        )
        for env, f in zip(envs, files, strict=True)
    ]
    deadline = time.monotonic() + timeout
    try:
        while any(p.poll() is None for p in procs):
            assert time.monotonic() < deadline, "a two-node run hung"
            time.sleep(0.2)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    outputs = []
    for proc, f in zip(procs, files, strict=True):
        f.seek(0)
        outputs.append(f.read())
        f.close()
        assert proc.returncode == 0, outputs[-1][-3000:]
    return outputs


def _free_port_in(low: int, high: int) -> int:
    for port in random.Random().sample(range(low, high), 200):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in [{low}, {high})")


def _assert_matches_single_process(records: Path, runs: dict) -> None:
    single = runs["single"]
    r0, r1 = (torch.load(records / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    assert r0["world_size"] == r1["world_size"] == 2
    for step, (b, b0, b1) in enumerate(zip(single["batches"], r0["batches"], r1["batches"], strict=True)):
        assert sorted(b) == sorted(b0 + b1), f"global batch {step}"
    for name, value in single["final_state"].items():
        torch.testing.assert_close(r0["final_state"][name], value, rtol=0, atol=ATOL, msg=name)


@pytest.mark.guarantee(
    "... and so do a 2-node run launched by `scripts/torchrun.sh` (the manual's command) and a 2-task "
    "`scripts/slurm.sbatch` job SIGTERMed mid-run, requeued and finished in its run directory (every rank stopped "
    "at the same step); FSDP2 on 2 processes (float32 only) computes, from its gathered weights, the gradient one "
    "process computes in float64 on the same global batch"
)
@pytest.mark.slow
def test_two_node_torchrun_on_loopback_matches_one_process(runs: dict, tmp_path: Path) -> None:
    # The manual's command (Scaling out): scripts/torchrun.sh on every "node", the same line, the run's configs after
    # it. Two torchrun agents meet through a static rendezvous on loopback (node ranks as given).
    fit_args = ["--config", DIGITS, "--data.batch_size=16", *COMMON,
                f"--trainer.callbacks.out_dir={tmp_path / 'records'}",
                f"--trainer.logger.init_args.save_dir={tmp_path / 'logs'}"]  # fmt: skip
    script = ["bash", str(ROOT / "scripts" / "torchrun.sh"), *fit_args]
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"  # the script's python, torchrun
    node = {"NNODES": "2", "NPROC_PER_NODE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
            "PATH": path}  # fmt: skip
    _two_launches([{**node, "NODE_RANK": "0"}, {**node, "NODE_RANK": "1"}], script, tmp_path / "out")
    _assert_matches_single_process(tmp_path / "records", runs)
    assert [d.name for d in (tmp_path / "logs" / "digits").iterdir()] == ["version_0"]  # one run directory


# srun for one machine: SLURM_NTASKS tasks of the command, each with its SLURM_PROCID, their pids in $SRUN_PIDS
# (SLURM's --signal=TERM@120 signals the tasks, not the batch script).
FAKE_SRUN = """#!/usr/bin/env bash
pids=()
for ((r = 0; r < SLURM_NTASKS; r++)); do
    SLURM_PROCID=$r SLURM_LOCALID=0 SLURM_NODEID=$r "$@" > "$SRUN_LOGS/job$SLURM_RESTART_COUNT-task$r.log" 2>&1 &
    pids+=($!)
done
echo "${pids[@]}" > "$SRUN_PIDS"
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit $status
"""


@pytest.mark.guarantee(
    "... and so do a 2-node run launched by `scripts/torchrun.sh` (the manual's command) and a 2-task "
    "`scripts/slurm.sbatch` job SIGTERMed mid-run, requeued and finished in its run directory (every rank stopped "
    "at the same step); FSDP2 on 2 processes (float32 only) computes, from its gathered weights, the gradient one "
    "process computes in float64 on the same global batch"
)
@pytest.mark.slow
def test_the_slurm_script_trains_one_ddp_run_that_a_sigterm_requeues_and_the_requeue_finishes(
    runs: dict, tmp_path: Path
) -> None:
    # scripts/slurm.sbatch as sbatch runs it, with srun and scontrol standing in for SLURM: two tasks form one DDP
    # world with ranks from SLURM_PROCID; SIGTERM (preemption) stops every rank at the same step with
    # last.ckpt saved (a rank that stopped elsewhere would leave the other in a collective until the timeout);
    # the script requeues the job, and the requeued job (same job id) continues the same run directory from that
    # checkpoint to the end, where the weights equal one process's on the combined batch.
    submit, bin_, logs = tmp_path / "submit", tmp_path / "bin", tmp_path / "tasks"
    for folder in (submit / ".venv" / "bin", bin_, logs):
        folder.mkdir(parents=True)
    (submit / "configs").symlink_to(ROOT / "configs")
    (submit / ".venv" / "bin" / "activate").write_text(f'export PATH="{Path(sys.executable).parent}:$PATH"\n')
    (bin_ / "srun").write_text(FAKE_SRUN)
    (bin_ / "scontrol").write_text(f'#!/usr/bin/env bash\necho "$@" >> {tmp_path / "scontrol.log"}\n')
    for tool in ("srun", "scontrol"):
        (bin_ / tool).chmod(0o755)
    port = _free_port_in(15000, 25000)  # SLURMEnvironment's port is 15000 + the job id's last 4 digits
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
           "PYTHONPATH": PYTHONPATH, "PATH": f"{bin_}{os.pathsep}{os.environ['PATH']}",
           "SLURM_SUBMIT_DIR": str(submit),
           "SLURM_JOB_ID": str(port - 15000), "SLURM_JOB_NAME": "train", "SLURM_NNODES": "2",
           "SLURM_NTASKS_PER_NODE": "1", "SLURM_NTASKS": "2", "SLURM_NODELIST": "localhost",
           "SRUN_LOGS": str(logs), "SRUN_PIDS": str(tmp_path / "pids")}  # fmt: skip
    release = tmp_path / "release"
    env["CONFIG"] = DIGITS  # the script's base config: the engine tests' own, not configs/default.yaml
    flags = ["--data.batch_size=16", *COMMON, f"--trainer.callbacks.out_dir={tmp_path / 'records'}",
             "--trainer.callbacks+=probes.Hold", f"--trainer.callbacks.release={release}",
             "--trainer.strategy=lightning.pytorch.strategies.DDPStrategy", "--trainer.strategy.timeout=0:01:00",
             f"--trainer.logger.init_args.save_dir={tmp_path / 'logs'}"]  # fmt: skip
    script = ["bash", str(ROOT / "scripts" / "slurm.sbatch"), *flags]

    job = subprocess.Popen(script, cwd=scratch_dir(), env={**env, "SLURM_RESTART_COUNT": "0"}, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while not all(Path(f"{release}.held-rank{r}").exists() for r in (0, 1)):  # both ranks at epoch 1's start
            assert job.poll() is None, job.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "the ranks never reached epoch 1"
            time.sleep(0.1)
        # SLURM signals every task, but not at one instant: a rank may see it a step before another. Signalled
        # alone, rank 0 must still stop with rank 1 at the same step (LastCheckpoint's all-reduce of the flag).
        os.kill(int((tmp_path / "pids").read_text().split()[0]), signal.SIGTERM)
        while not Path(f"{release}.left-rank0").exists():  # rank 0 took the signal (it lets go of its hold)
            assert job.poll() is None and time.monotonic() < deadline, "rank 0 did not take the SIGTERM"
            time.sleep(0.1)
        release.touch()  # rank 1 goes on, never signalled
        out, _ = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    task0 = (logs / "job0-task0.log").read_text()
    assert job.returncode == 143, out[-2000:] + task0[-3000:]
    assert "Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2" in (logs / "job0-task1.log").read_text()
    assert "Interrupted by SIGTERM after step 45" in task0  # epoch 1's first step, on every rank
    assert (tmp_path / "scontrol.log").read_text().split() == ["requeue", env["SLURM_JOB_ID"]]
    run = tmp_path / "logs" / "digits" / f"slurm-{env['SLURM_JOB_ID']}"
    assert [d.name for d in (tmp_path / "logs" / "digits").iterdir()] == [run.name]  # one run directory

    # The requeued job: the same script, the same job id.
    requeued = subprocess.run(script, cwd=scratch_dir(), env={**env, "SLURM_RESTART_COUNT": "1"},
                              capture_output=True, text=True, timeout=240)  # fmt: skip
    assert requeued.returncode == 0, requeued.stdout[-2000:] + (logs / "job1-task0.log").read_text()[-3000:]
    assert f"Requeued: continuing {run}" in requeued.stdout
    assert [d.name for d in (tmp_path / "logs" / "digits").iterdir()] == [run.name]  # continued in place
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["best.ckpt", "last.ckpt"]  # rank 0 alone
    r0, r1 = (torch.load(tmp_path / "records" / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    assert r0["global_step"] == r1["global_step"] == 2 * STEPS_PER_EPOCH
    for name, value in runs["single"]["final_state"].items():
        torch.testing.assert_close(r0["final_state"][name], value, rtol=0, atol=ATOL, msg=name)


@pytest.mark.guarantee(
    "... and so do a 2-node run launched by `scripts/torchrun.sh` (the manual's command) and a 2-task "
    "`scripts/slurm.sbatch` job SIGTERMed mid-run, requeued and finished in its run directory (every rank stopped "
    "at the same step); FSDP2 on 2 processes (float32 only) computes, from its gathered weights, the gradient one "
    "process computes in float64 on the same global batch"
)
@pytest.mark.slow
def test_fsdp_on_two_processes_matches_one_process_and_checkpoints_whole(runs: dict, tmp_path: Path) -> None:
    # FSDP2 (fully_shard) through ModelParallelStrategy, which runs on CPUs with gloo (strategy: fsdp does not)
    # and only in float32, so the comparison is made from the same state: at each of the first optimizer steps
    # the full weights and the full gradient that FSDP computed from its shards are gathered, and the gradient
    # is recomputed here in float64 from those very weights on the same global batch.
    no_recorder = [a for a in COMMON if "probes.Recorder" not in a and "precision" not in a]
    result = run_ranks(
        "fit", "--config", DIGITS, "--config", str(ROOT / "configs" / "fsdp.yaml"), "--data.batch_size=16",
        *no_recorder, f"--trainer.logger.init_args.save_dir={tmp_path}",
        "--trainer.callbacks+=probes.FullStateAtSteps", f"--trainer.callbacks.out={tmp_path / 'fsdp.pt'}",
        cwd=scratch_dir(),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    last = torch.load(tmp_path / "digits" / "version_0" / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["global_step"] == 2 * STEPS_PER_EPOCH
    for name, value in runs["single"]["final_state"].items():
        assert last["state_dict"][name].shape == value.shape  # saved whole, not as shards
    assert "train/grad_norm" in scalars(tmp_path / "digits" / "version_0")  # the norm over all shards

    snapshots = torch.load(tmp_path / "fsdp.pt", weights_only=True)
    train_set = runs["datamodule"].train_set.inner  # the single run's split (unwrapped from the Recorder)
    assert len(snapshots) == 3
    for step, (weights, grads) in enumerate(snapshots):
        net = ConvNet((1, 8, 8), 10, dropout=0.0).double()
        net.load_state_dict({k: v.double() for k, v in weights.items()})
        batch = runs["single"]["batches"][step]  # the global batch one process trained on
        x, y = (torch.stack(t) for t in zip(*(train_set[i] for i in batch), strict=True))
        F.cross_entropy(net(x.double()), y).backward()
        for name, param in net.named_parameters():
            # float32 forward+backward against float64: reductions of up to ~10^3 terms at unit roundoff 6e-8
            # leave ~1e-5 of the gradient's scale; a wrong shard, a missing sum or half the batch is O(1) off.
            scale = param.grad.abs().max().item()
            torch.testing.assert_close(grads[name].double(), param.grad, rtol=1e-4, atol=1e-5 * scale, msg=name)


class TiedHead(torch.nn.Module):
    """A head tied to the embedding (as a GPT's is), with or without naming its FSDP units."""

    def __init__(self, name_units: bool) -> None:
        super().__init__()
        self.embedding, self.block = torch.nn.Embedding(10, 4), torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.embedding.weight
        if name_units:
            self.shard_units = lambda: [self.block]


def test_fsdp_refuses_a_weight_tied_across_its_units_in_one_sentence() -> None:
    from project.engine import ConfigError
    from project.engine.model.sharding import units_of

    # Every Linear a unit: head.weight would be in the head's group and, as embedding.weight, in the net's.
    with pytest.raises(ConfigError, match=r"TiedHead: its parameter (head|embedding)\.weight is tied.*shard_units"):
        units_of(TiedHead(name_units=False))
    tied = TiedHead(name_units=True)
    assert units_of(tied) == [tied.block]  # the tie left to the net itself: one weight, one group
