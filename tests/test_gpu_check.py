"""scripts/gpu_check.sh, the first thing to run on a GPU workstation, in its CPU mode: every command it runs on a
GPU (the gpu-marked tests, the bench, the fits over configs/gpu.yaml) runs here, tiny, so it cannot rot unseen.
The template's own tooling, like the commands its manual shows: `make check-manual` runs it, not `make test`."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import DIGITS, PYTHONPATH, ROOT, scratch_dir, wait_or_kill


@pytest.mark.guarantee(
    "`scripts/gpu_check.sh` runs every command on the CPU (`--cpu`), its GPU report included (every figure read "
    "back from the check's runs and the bench, a row per fit and per workload, the JSON file); its GPU-only branch "
    "names only workloads the bench has"
)
@pytest.mark.manual
def test_the_gpu_check_script_runs_every_command_on_the_cpu(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON_BIN": sys.executable, "GPU_CHECK_OUT": str(tmp_path / "results"),
           "GPU_CHECK_LOGS": str(tmp_path / "logs"), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
           "GPU_CHECK_CONFIG": DIGITS, "PYTHONPATH": PYTHONPATH}  # the engine tests' own run  # fmt: skip
    proc = subprocess.Popen(
        ["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--cpu"], cwd=scratch_dir(), env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    out, _ = wait_or_kill(proc, 600, "scripts/gpu_check.sh --cpu")
    assert proc.returncode == 0, out[-3000:]
    assert " skipped" in out and "failed" not in out  # the gpu-marked tests: collected, and skipped on a CPU
    assert "default: 20 steps per epoch" in out and len(list((tmp_path / "results").glob("bench-*.json"))) == 1
    assert [line for line in out.splitlines() if line.startswith("== ")] == [
        "== --trainer.precision=32-true", "== --trainer.precision=bf16-mixed",
        "== --trainer.precision=bf16-mixed --model.compile=eager",
    ]  # fmt: skip
    assert out.count("Test of ") == 3 and len(list((tmp_path / "logs" / "gpu-check").glob("version_*"))) == 3
    # The report: one row per fit with every figure read back from its run, one per bench workload, a JSON file.
    (path,) = (tmp_path / "results").glob("gpu-*.json")
    report = json.loads(path.read_text())
    assert [(f["precision"], f["compile"]) for f in report["fits"]] == [
        ("32-true", False), ("bf16-mixed", False), ("bf16-mixed", "eager")]  # fmt: skip
    for fit in report["fits"]:
        assert all(fit[k] is not None for k in ("step_ms", "samples_per_sec", "first_logged_step_s",
                                                 "peak_memory_mb", "data_wait", "test_score")), fit  # fmt: skip
        assert fit["step_ms"] > 0 and 0 <= fit["data_wait"] <= 1 and fit["test_metric"] == "test/acc"
    # The bench in bf16-mixed with a compiled net: the template and its hand-written loop both (the loop autocasts
    # and compiles as the flags say), one row with both throughputs.
    assert [(r["workload"], r["precision"], r["compile"]) for b in report["benches"] for r in b["rows"]] == [
        ("default", "bf16-mixed", "eager")]  # fmt: skip
    assert "| precision | compile | step ms |" in out and "| bench workload | precision | compile |" in out
    assert "| default | bf16-mixed | eager |" in out
    assert "paste the tables above into an issue, with the command: scripts/gpu_check.sh --cpu" in out


@pytest.mark.guarantee(
    "`scripts/gpu_check.sh` runs every command on the CPU (`--cpu`), its GPU report included (every figure read "
    "back from the check's runs and the bench, a row per fit and per workload, the JSON file); its GPU-only branch "
    "names only workloads the bench has"
)
def test_the_gpu_only_branch_names_only_what_exists() -> None:
    # What the CPU mode cannot run (the long workload takes minutes on a CPU): its names are checked here.
    import re

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench

    script = (ROOT / "scripts" / "gpu_check.sh").read_text()
    named = {w for group in re.findall(r"--(?:workloads|parts) ([\w ]+?)(?= --| \$|\))", script) for w in group.split()}
    assert named and named <= set(bench.WORKLOADS), (
        f"gpu_check.sh names workloads {named}, bench has {set(bench.WORKLOADS)}"
    )
