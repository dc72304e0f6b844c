"""The host's work per step beyond the math: nothing that waits for the device, nothing repeated every step that
once in a while would do. (The evaluation step's ops are checked for host syncs in the contract suite.)"""

import gc
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning as L
import pytest
import torch
from conftest import DIGITS, fit, scalars

from project.engine import CLI, CSVPredictionWriter, Provenance, TaskEarlyStopping, ThrottledProgressBar, TrackerRun
from project.engine.observe import progress
from project.engine.run.run_directory import SaveConfig

pytestmark = pytest.mark.slow
SHORT = ("--trainer.max_epochs=2", "--trainer.limit_train_batches=12", "--trainer.limit_val_batches=3",
         "--trainer.log_every_n_steps=2", "--trainer.enable_checkpointing=false")  # fmt: skip


class Clock:
    """A stand-in for time.monotonic that moves ``step`` seconds per call: 0 stands still, 1 outpaces any redraw."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 1000.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def _reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: Clock) -> tuple[list[dict], Any]:
    """A short fit: how often the progress bar read the metrics it shows (each read turns every shown metric into a
    Python float, a host sync on a GPU): what each read found, and the run."""
    reads = []
    monkeypatch.setattr(progress.time, "monotonic", clock)
    get_metrics = ThrottledProgressBar.get_metrics
    monkeypatch.setattr(
        ThrottledProgressBar, "get_metrics", lambda self, *a: reads.append(get_metrics(self, *a)) or reads[-1]
    )
    cli = fit(tmp_path, *SHORT)
    return reads, cli


@pytest.mark.guarantee(
    "the host does per step only what the step needs: the progress bar reads the logged metrics only when it "
    "redraws; a run on the CPU asks NVML nothing per step"
)
def test_the_progress_bar_reads_its_metrics_only_as_often_as_it_redraws(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The clock standing still: within one redraw interval, the bar reads at an epoch's last batch and end and after
    # validation, not after each of its 12 steps (Lightning's RichProgressBar reads 12 + 2 times per epoch).
    reads, cli = _reads(tmp_path / "still", monkeypatch, Clock(0.0))
    assert cli.trainer.global_step == 24
    assert len(reads) <= 4 * 2, len(reads)
    # What it shows last is the run's final values all the same (the epoch's end is always read).
    final = scalars(cli.trainer.log_dir)["val/acc"][-1][1]
    assert reads[-1]["val/acc"] == pytest.approx(final) and "v_num" not in reads[-1]  # the run dir is printed
    # A clock faster than the redraws: every step is due a read (time decides, not a count of batches).
    reads, _ = _reads(tmp_path / "fast", monkeypatch, Clock(1.0))
    assert len(reads) >= 24, len(reads)


@pytest.mark.guarantee(
    "the host does per step only what the step needs: the progress bar reads the logged metrics only when it "
    "redraws; a run on the CPU asks NVML nothing per step"
)
def test_a_run_on_the_cpu_asks_nvml_nothing_per_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the CUDA build of torch and no GPU in use, Lightning's PYTORCH_NVML_BASED_CUDA_CHECK=1 made every AdamW
    step (torch.optim's graph-capture check) probe NVML anew: a dlopen of libnvidia-ml per step. Simulated here on
    any build: torch "compiled with CUDA", NVML answering no device. The probes of start-up are the same for a run
    of any length; a run twice as long must not probe more."""
    probes = []
    monkeypatch.setattr(torch._C, "_accelerator_getAccelerator", lambda: torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "_is_compiled", lambda: True)
    monkeypatch.setattr(torch.cuda, "_device_count_nvml", lambda: probes.append(1) or 0)
    monkeypatch.setattr(torch._C, "_cuda_getDeviceCount", lambda: 0, raising=False)
    counts = []
    for epochs in (1, 2):
        monkeypatch.setenv("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # as importing Lightning set it
        probes.clear()
        cli = fit(tmp_path / str(epochs), *SHORT, f"--trainer.max_epochs={epochs}", "--trainer.accelerator=cpu")
        assert cli.trainer.global_step == 12 * epochs
        counts.append(len(probes))
    assert counts[1] == counts[0], f"NVML probed {counts[0]} times in 12 steps, {counts[1]} in 24"


@pytest.mark.guarantee(
    "a step-based run's progress bar gives the run's length in steps (Lightning's reads \"Epoch 0/-2\")"
)
def test_a_step_based_runs_bar_gives_its_length_in_steps() -> None:
    bar = ThrottledProgressBar()
    bar._trainer = SimpleNamespace(max_epochs=-1, max_steps=1500)  # max_epochs null, as Lightning keeps it
    assert bar._get_train_description(0) == "Epoch 0 (a 1500-step run)"  # Lightning's own: "Epoch 0/-2"
    bar._trainer = SimpleNamespace(max_epochs=40, max_steps=-1)
    assert bar._get_train_description(3).strip() == "Epoch 3/39"


def _calls_per_step(tmp_path: Path, drop: tuple[type, ...] = (), add: tuple[L.Callback, ...] = ()) -> int:
    """The Python calls (sys.setprofile's "call" events: every function, Lightning's loop and hooks included) of
    training steps 2..9 of a short fit of the config's trainer without its progress bar (its reads depend on the
    clock) and without the callbacks of types ``drop``, plus ``add``."""
    found = []

    class Count(L.Callback):
        def on_train_batch_start(self, trainer: L.Trainer, *_: Any) -> None:
            if trainer.global_step == 2:  # the garbage collector off: a finalizer it runs is no callback's call
                gc.collect()
                gc.disable()
                sys.setprofile(lambda frame, event, arg: found.append(1) if event == "call" else None)
            elif trainer.global_step == 10:
                sys.setprofile(None)
                gc.enable()

    cli = CLI(["--config", DIGITS, f"--trainer.logger.init_args.save_dir={tmp_path}", *SHORT[:-1]], run=False)
    kept = [cb for cb in cli.trainer.callbacks if not isinstance(cb, (ThrottledProgressBar, *drop))]
    assert all(any(type(cb) is t for cb in cli.trainer.callbacks) for t in drop), "the config lacks one to drop"
    cli.trainer.callbacks = [*kept, *add, Count()]
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 24
    return len(found)


@pytest.mark.guarantee("a callback costs no Python call on the batches it does nothing on")
def test_callbacks_that_do_nothing_on_a_step_cost_nothing_on_it(tmp_path: Path) -> None:
    """Lightning calls every per-batch hook of every callback (~11 Python calls each, defined or not) unless the hook
    is not callable (project/engine/hooks.py). The template's callbacks with nothing to do on a training step, and
    LightningCLI's config saver (ours: SaveConfig), add not one call to it; an undecorated callback does (so the count
    sees a callback)."""
    idle = (Provenance, TrackerRun, CSVPredictionWriter, TaskEarlyStopping, SaveConfig)
    # First (its count pays for the first isinstance checks of a process, which Python's ABCs cache): plain.
    plain = _calls_per_step(tmp_path / "plain", drop=idle, add=(L.Callback(),))
    without = _calls_per_step(tmp_path / "without", drop=idle)
    with_them = _calls_per_step(tmp_path / "all")
    assert with_them == without, f"{with_them - without} calls in 8 steps from callbacks with no per-step work"
    assert plain - without >= 8 * 6, plain - without  # six hooks a step, each at least the call itself


OPTIONAL = ("optuna", "mlflow", "wandb", "onnx", "onnxruntime", "onnxscript", "peft", "bitsandbytes", "psycopg",
            "nbclient", "pyarrow", "timm")  # fmt: skip


@pytest.mark.guarantee(
    "a run imports no optional library it does not use: a short fit of the engine's digits and its test "
    "loads no tracker, sweep, export, fine-tuning or table library"
)
def test_a_run_imports_no_optional_library_it_does_not_use(tmp_path: Path) -> None:
    import os
    import subprocess

    from conftest import PYTHONPATH

    # A fresh interpreter (this one has imported the suite's): a fit of two steps, then its test.
    flags = [f"--trainer.logger.init_args.save_dir={tmp_path}", "--trainer.max_steps=2", "--model.warmup=0",
             "--trainer.limit_val_batches=0", "--trainer.enable_checkpointing=false"]  # fmt: skip
    script = (
        "import sys\nfrom project.engine import CLI\n"
        f"CLI(['fit', '--config', {DIGITS!r}, *{flags!r}])\n"
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    env = {**os.environ, "PYTHONPATH": PYTHONPATH, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = set(done.stdout.splitlines()[-1].split())  # the script's last line: the modules it loaded
    assert "torch" in loaded and not loaded & set(OPTIONAL), sorted(loaded & set(OPTIONAL))
