"""Every run says what produced it (provenance.json: command, commit and patch, versions, machine, how each
segment ended), and `make runs` lists the runs from those records alone."""

import importlib.metadata
import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from conftest import DIGITS, ROOT, fit
from probes import Crash

from project.engine.checkpointing.last_checkpoint import Interrupted
from project.engine.observe.provenance import ending, git_state
from project.engine.observe.runs import table

SHORT = ("--trainer.max_epochs=2", "--trainer.limit_train_batches=5", "--trainer.limit_val_batches=2",
         "--trainer.limit_test_batches=2", "--trainer.enable_progress_bar=false")  # fmt: skip
# EarlyStopping that can never see an improvement after the first epoch: stops at epoch 1 of 4.
EARLY = """
trainer:
  max_epochs: 4
  callbacks:
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {filename: best, monitor: val/acc, mode: max}
    - class_path: lightning.pytorch.callbacks.EarlyStopping
      init_args: {monitor: val/loss, mode: min, patience: 1, min_delta: 100.0}
    - class_path: project.engine.Provenance
"""


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def _repo(path: Path) -> Path:
    path.mkdir()
    _git(path, "init", "-q")
    _git(path, "config", "user.email", "t@example.com")
    _git(path, "config", "user.name", "t")
    (path / ".gitignore").write_text("*.log\n")
    (path / "train.py").write_text("lr = 0.1\n")
    (path / "weights.bin").write_bytes(bytes(range(256)))
    _git(path, "add", ".")
    _git(path, "commit", "-qm", "first")
    return path


@pytest.mark.guarantee(
    "each `fit` appends a provenance segment with how it ended (finished, resumed, crashed, interrupted, stopped "
    "early), the commit and dirty flag of the checkout, versions, pip freeze; a dirty tree's patch, untracked "
    "files included, reproduces it with `git apply`"
)
def test_a_dirty_tree_gives_a_patch_that_git_apply_reproduces(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "repo")
    clean = git_state(repo, tmp_path / "clean.patch")
    assert clean["commit"] == _git(repo, "rev-parse", "HEAD").strip() and clean["dirty"] is False
    assert not (tmp_path / "clean.patch").exists()

    (repo / "train.py").write_text("lr = 0.05  # tuned\n")  # a tracked change
    (repo / "weights.bin").write_bytes(bytes(range(255, -1, -1)))  # a binary one
    (repo / "new_data.py").write_text("class Mine: ...\n")  # an untracked file
    (repo / "run.log").write_text("ignored\n")  # ignored: not part of the code
    state = git_state(repo, tmp_path / "dirty.patch")
    assert state["dirty"] is True and state["patch"] == "dirty.patch"

    copy = tmp_path / "copy"
    subprocess.run(["git", "clone", "-q", str(repo), str(copy)], check=True)
    _git(copy, "checkout", "-q", state["commit"])
    _git(copy, "apply", str(tmp_path / "dirty.patch"))
    for name in ("train.py", "weights.bin", "new_data.py"):
        assert (copy / name).read_bytes() == (repo / name).read_bytes(), name
    assert not (copy / "run.log").exists()


@pytest.mark.guarantee(
    "the patch of a dirty tree never copies a file whose name looks like a secret (a planted `.env` with a token), "
    "nor non-source files; each is listed with its size and why"
)
def test_the_patch_never_copies_a_secret_and_lists_what_it_leaves_out(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "repo")
    token = "ghp_0123456789abcdefFAKEtoken"
    planted = {".env": f"GITHUB_TOKEN={token}\n", "deploy.key": token, "configs/my_secret.yaml": f"key: {token}\n",
               "notes/api_token.txt": token, "data.npy": "not source"}  # fmt: skip
    for name, text in planted.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    (repo / "configs" / "mine.yaml").write_text("model:\n  lr: 0.01\n")  # your config: copied
    state = git_state(repo, tmp_path / "dirty.patch")
    patch = (tmp_path / "dirty.patch").read_text()
    assert token not in patch and "configs/mine.yaml" in patch
    left_out = {entry["name"]: entry["why"] for entry in state["untracked_not_in_patch"]}
    assert left_out == {".env": "its name looks like a secret", "deploy.key": "its name looks like a secret",
                        "configs/my_secret.yaml": "its name looks like a secret",
                        "notes/api_token.txt": "its name looks like a secret",
                        "data.npy": "not a source or config file"}  # fmt: skip
    assert all(entry["bytes"] > 0 for entry in state["untracked_not_in_patch"])


def test_the_recorded_checkout_is_the_repository_root() -> None:
    # The patch of a dirty tree is taken from here (git diff and untracked files relative to it): a subfolder would
    # miss untracked files outside it (a config of yours) and write paths git apply puts in the wrong place.
    from project.engine.observe.provenance import PROJECT_ROOT

    top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=ROOT, capture_output=True, text=True)
    assert PROJECT_ROOT == ROOT and (top.returncode != 0 or Path(top.stdout.strip()) == ROOT)


def test_outside_a_git_checkout_the_record_says_so(tmp_path: Path) -> None:
    state = git_state(tmp_path, tmp_path / "x.patch")
    assert state["commit"] is None and "not a git checkout" in state["note"]


def test_how_a_segment_ended_in_words() -> None:
    trainer = SimpleNamespace(early_stopping_callbacks=[SimpleNamespace(stopped_epoch=0)], callbacks=[])
    assert ending(trainer) == "finished"
    trainer.early_stopping_callbacks[0].stopped_epoch = 7
    assert ending(trainer) == "stopped early at epoch 7"
    assert ending(trainer, Crash("out of memory\nmore")) == "crashed: Crash: out of memory"
    assert ending(trainer, Interrupted(15, Path("last.ckpt"), 42, 0)) == "interrupted by SIGTERM at step 42"


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Five runs: finished then resumed, finished, crashed, interrupted by Ctrl-C, stopped early (its own
    experiment name)."""
    logs = tmp_path_factory.mktemp("runs") / "logs"
    first = fit(logs, *SHORT)
    fit(logs, *SHORT, "--model.optimizer.lr=0.01")
    with pytest.raises(Crash):
        fit(logs, *SHORT, "--trainer.callbacks+=probes.CrashAt", "--trainer.callbacks.step=3")
    with pytest.raises(Interrupted):
        fit(logs, *SHORT, "--trainer.callbacks+=probes.CrashAt", "--trainer.callbacks.step=3",
            "--trainer.callbacks.signal=2")  # fmt: skip
    early = logs.parent / "early.yaml"
    early.write_text(EARLY)
    fit(logs, *SHORT[1:], "--trainer.logger.init_args.name=early", configs=(DIGITS, str(early)))
    run = Path(first.trainer.log_dir)
    fit(logs, "--trainer.max_epochs=3", "--ckpt_path", str(run / "checkpoints" / "last.ckpt"),
        configs=(str(run / "config.yaml"),))  # fmt: skip
    return logs


def _segments(run: Path) -> list[dict]:
    return json.loads((run / "provenance.json").read_text())["segments"]


@pytest.mark.guarantee(
    "each `fit` appends a provenance segment with how it ended (finished, resumed, crashed, interrupted, stopped "
    "early), the commit and dirty flag of the checkout, versions, pip freeze; a dirty tree's patch, untracked "
    "files included, reproduces it with `git apply`"
)
@pytest.mark.slow
def test_each_run_records_what_produced_it_and_how_each_segment_ended(logs: Path) -> None:
    runs = logs / "digits"
    resumed, finished, crashed, interrupted = (_segments(runs / f"version_{i}") for i in range(4))
    assert [s["status"] for s in resumed] == ["finished", "finished"]  # a resume appends a segment
    assert resumed[1]["resumed_from"].endswith("version_0/checkpoints/last.ckpt") and resumed[1]["epochs"] == 3
    assert finished[0]["status"] == "finished" and finished[0]["steps"] == 10
    assert crashed[0]["status"] == "crashed: Crash: simulated crash"
    assert interrupted[0]["status"].startswith("interrupted by SIGINT at step ")
    assert _segments(logs / "early" / "version_0")[0]["status"] == "stopped early at epoch 1"

    segment = finished[0]
    assert segment["versions"]["torch"] == torch.__version__
    assert segment["machine"]["world_size"] == 1 and segment["machine"]["cpus"] >= 1
    assert segment["command"] == shlex.join(sys.orig_argv)  # this process's command line; the CLI's arguments:
    assert segment["cli_args"][0] == "fit" and "--model.optimizer.lr=0.01" in segment["cli_args"]
    packages = (runs / "version_1" / segment["pip_freeze"]).read_text()
    assert f"torch=={importlib.metadata.version('torch')}" in packages
    # The second segment ran with the same packages: no second copy, the record points at the first.
    assert resumed[1]["pip_freeze"] == "pip-freeze-0.txt" and not (runs / "version_0" / "pip-freeze-1.txt").exists()
    try:
        head = _git(ROOT, "rev-parse", "HEAD").strip()
    except (OSError, subprocess.CalledProcessError):
        assert segment["git"]["commit"] is None
    else:
        assert segment["git"]["commit"] == head
        assert segment["git"]["dirty"] == bool(_git(ROOT, "status", "--porcelain").strip())
    scores = segment["scores"]
    assert 0 <= scores["test/acc"] <= 1 and 0 <= scores["best val/acc"] <= 1


@pytest.mark.guarantee(
    "`make runs` lists 5 kinds of runs with their status, scores and differing hyperparameters, without importing torch"
)
@pytest.mark.slow
def test_make_runs_lists_every_run_from_the_records_alone(logs: Path) -> None:
    lines = table(logs).splitlines()
    header, rows = lines[0].split(), [line for line in lines[1:]]
    assert header[:3] == ["run", "status", "started"] and "model.optimizer.init_args.lr" in header
    by_run = {row.split()[0]: row for row in rows}
    assert list(by_run) == [f"digits/version_{i}" for i in range(4)] + ["early/version_0"]  # by start time
    assert "finished (resumed 1x)" in by_run["digits/version_0"]
    assert "crashed: Crash: simulated crash" in by_run["digits/version_2"]
    assert "interrupted by SIGINT" in by_run["digits/version_3"]
    assert "stopped early at epoch 1" in by_run["early/version_0"]
    finished = _segments(logs / "digits" / "version_1")[0]
    assert f"{finished['scores']['test/acc']:.4f}" in by_run["digits/version_1"]
    assert " 0.01 " in by_run["digits/version_1"]  # the hyperparameter that differs
    assert table(logs, "early").splitlines()[1].startswith("early/version_0")
    assert len(table(logs, "early").splitlines()) == 2


@pytest.mark.slow
@pytest.mark.guarantee(
    "`make runs` shows the config keys that differ with the recipe's (model.*) first, then the trainer's and the "
    "data's, and says how many more differ than it shows"
)
def test_make_runs_shows_the_recipes_keys_first_and_says_how_many_more_differ(logs: Path, tmp_path: Path) -> None:
    # Two of the runs, one of them given another batch size too: data.* sorts before model.*, the recipe comes first.
    for i in (0, 1):
        shutil.copytree(logs / "digits" / f"version_{i}", tmp_path / "digits" / f"version_{i}")
    config = tmp_path / "digits" / "version_1" / "config.yaml"
    config.write_text(config.read_text().replace("batch_size: 64", "batch_size: 32", 1))
    narrow = table(tmp_path, max_hparams=1).splitlines()
    assert narrow[0].split()[-2] == "model.optimizer.init_args.lr"  # before the commit column
    more = "(2 more keys differ: trainer.max_epochs, data.batch_size; make runs ARGS='--columns 10' shows more)"
    assert narrow[-1] == more  # the model's keys, the trainer's, the data's
    assert table(tmp_path, max_hparams=3).splitlines()[0].split()[-4:-1] == [
        "model.optimizer.init_args.lr", "trainer.max_epochs", "data.batch_size"]  # fmt: skip
    # Another optimizer (its own arguments, none of AdamW's) and schedule: the classes first, then what both runs
    # have, before the arguments only one of the optimizers takes.
    tree = yaml.safe_load(config.read_text())
    recipe = tree["model"]["init_args"]
    recipe["optimizer"] = {"class_path": "torch.optim.SGD", "init_args": {"lr": 0.01, "momentum": 0.9}}
    recipe["warmup"], recipe["schedule"]["class_path"] = 3, "project.recipe.WarmupLinear"
    config.write_text(yaml.safe_dump(tree))
    assert table(tmp_path, max_hparams=5).splitlines()[0].split()[-6:-1] == [
        "model.optimizer.class_path", "model.schedule.class_path", "model.optimizer.init_args.lr", "model.warmup",
        "model.optimizer.init_args.amsgrad"]  # fmt: skip


@pytest.mark.guarantee(
    "`make runs` lists 5 kinds of runs with their status, scores and differing hyperparameters, without importing torch"
)
@pytest.mark.slow
def test_make_runs_does_not_import_the_training_stack(logs: Path) -> None:
    # What keeps it quick (a fraction of a second, against ~4 s for importing Lightning): no torch at all.
    code = "import sys; from project.engine.observe.runs import main; main"
    code += "(['--logs', sys.argv[1]]); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code, str(logs)], capture_output=True, text=True, check=True).stdout
    assert out.strip().endswith("False") and "digits/version_0" in out
