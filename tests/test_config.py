"""Config overlays compose and run; bad input exits non-zero with a message naming the key."""

import logging
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from conftest import DEBUG, DIGITS, PACKAGE, ROOT, USER_DEFAULT, fit, run_module

from project.engine import main

BF16 = str(ROOT / "configs" / "precision" / "bf16.yaml")
FP16 = str(ROOT / "configs" / "precision" / "fp16.yaml")
DDP = str(ROOT / "configs" / "ddp.yaml")  # run by tests/test_ddp.py
PROFILE = str(ROOT / "configs" / "profile.yaml")  # run by tests/test_observability.py
FSDP = str(ROOT / "configs" / "fsdp.yaml")  # run by tests/test_ddp.py
GPU = str(ROOT / "configs" / "gpu.yaml")  # needs CUDA to run; its compile path is run below on CPU


DEBUG_OVERLAYS = {name: str(ROOT / "configs" / "debug" / f"{name}.yaml")
                  for name in ("fast_dev_run", "overfit", "limit", "profiler", "anomaly")}  # fmt: skip


SHIPPED = sorted(p for p in (ROOT / "configs").rglob("*.yaml") if p.parent.name != "sweeps")  # test_sweep: those


@pytest.mark.parametrize("config", SHIPPED, ids=[str(p.relative_to(ROOT / "configs")) for p in SHIPPED])
def test_every_shipped_config_composes_over_the_default(config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each config file parses over the repository's own default, as `make train ARGS="--config ..."` layers it: a
    key it sets that the task, the DataModule or the Trainer does not take is refused here. (Whether it trains: the
    tests that run it.)"""
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", USER_DEFAULT, "--config", str(config), "--print_config"])
    assert exit_info.value.code in (0, None), capsys.readouterr().err[-2000:]
    assert yaml.safe_load(capsys.readouterr().out)["model"]["class_path"]  # printed: it parsed


@pytest.mark.guarantee(
    "Lightning's everyday flags (`fast_dev_run`, `overfit_batches`, no validation, no checkpointing, no logger, "
    "CSVLogger, `val_check_interval`, `max_time`, ...) run to their test scores inside one run directory under "
    "`logs/`, or are refused in one sentence"
)
@pytest.mark.slow
@pytest.mark.parametrize("name", DEBUG_OVERLAYS)
def test_debug_overlay_runs_to_its_test_scores(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    # Shortened where the overlay trains long (overfit: 50 epochs); the run goes in logs/<overlay name>.
    short = ("--trainer.max_epochs=2",) if name in ("overfit", "profiler") else ()
    main(["fit", "--config", DIGITS, "--config", DEBUG_OVERLAYS[name], *short])
    out = capsys.readouterr().out
    assert "test/acc=" in out
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    if name == "fast_dev_run":
        assert written == []
    else:
        assert {p.relative_to(tmp_path).parts[:3] for p in written} == {("logs", name, "version_0")}
    if name == "profiler":
        assert "FIT Profiler Report" in caplog.text  # Lightning logs it at INFO when the run ends


@pytest.mark.parametrize(
    ("overlay", "key", "expected"),
    [
        (BF16, ("trainer", "precision"), "bf16-mixed"),
        (FP16, ("trainer", "precision"), "16-mixed"),
        (DDP, ("trainer", "strategy"), "ddp"),
        (DEBUG, ("trainer", "limit_train_batches"), 5),
        (PROFILE, ("trainer", "max_steps"), 40),
        (GPU, ("model", "init_args", "compile"), True),
        (FSDP, ("trainer", "devices"), 2),
    ],
)
def test_overlay_composes_over_the_default(
    overlay: str, key: tuple[str, ...], expected: object, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", DIGITS, "--config", overlay, "--print_config"])
    assert exit_info.value.code in (0, None)
    printed = yaml.safe_load(capsys.readouterr().out)
    value = printed
    for part in key:
        value = value[part]
    assert value == expected
    # Everything else still comes from the default (overlays hold no lists that would replace the callbacks).
    assert printed["trainer"]["logger"]["init_args"]["save_dir"] == "logs"
    listed = yaml.safe_load(Path(DIGITS).read_text())["trainer"]["callbacks"]
    assert [c["class_path"] for c in printed["trainer"]["callbacks"]] == [c["class_path"] for c in listed]
    assert printed["model"]["init_args"]["net"]["class_path"] == "toy.ConvNet"


@pytest.mark.slow
@pytest.mark.parametrize("overlay", [BF16, FP16])
def test_precision_overlay_runs_a_debug_fit(overlay: str, tmp_path: Path) -> None:
    cli = fit(tmp_path, configs=(DIGITS, overlay, DEBUG))
    # No float16 autocast on CPU: Lightning runs 16-mixed as bf16-mixed there.
    expected = "16-mixed" if overlay == FP16 and torch.cuda.is_available() else "bf16-mixed"
    assert cli.trainer.precision == expected
    last = torch.load(tmp_path / "debug" / "version_0" / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["global_step"] == 5
    assert all(torch.isfinite(t).all() for t in last["state_dict"].values())


@pytest.mark.guarantee(
    "every checkpoint loads with `weights_only=True`; hparams are plain data; the net is rebuilt from them"
)
@pytest.mark.slow
def test_the_net_is_swapped_by_config_and_gets_its_shapes_from_the_data(tmp_path: Path) -> None:
    cli = fit(tmp_path, "--model.net=toy.MLP", "--model.net.init_args.hidden=32", configs=(DIGITS, DEBUG))
    assert type(cli.model.net).__name__ == "MLP"
    assert cli.model.net.layers[1].in_features == 64 and cli.model.net.layers[1].out_features == 32
    saved = torch.load(tmp_path / "debug" / "version_0" / "checkpoints" / "last.ckpt", weights_only=True)
    net = saved["hyper_parameters"]["net"]
    assert net["class_path"] == "toy.MLP"
    assert net["init_args"] == {"input_shape": (1, 8, 8), "num_outputs": 10, "hidden": 32, "dropout": 0.1}


@pytest.mark.guarantee("a compiled net's checkpoint loads into an uncompiled one")
@pytest.mark.slow
def test_a_compiled_net_trains_and_its_checkpoint_loads_into_a_plain_one(tmp_path: Path) -> None:
    from toy import Classifier

    cli = fit(tmp_path, "--model.compile=eager", "--data.num_workers=null", configs=(DIGITS, DEBUG))
    assert cli.model.net._compiled_call_impl is not None  # really compiled (the eager backend: fast on a CPU)
    assert cli.datamodule.train_dataloader().num_workers >= 1  # null: from the CPU count
    best = tmp_path / "debug" / "version_0" / "checkpoints" / "best.ckpt"
    state = torch.load(best, weights_only=True)["state_dict"]
    assert not [k for k in state if "_orig_mod" in k]
    plain = Classifier.load_from_checkpoint(best, weights_only=True, compile=False).eval()
    assert plain.net._compiled_call_impl is None  # an uncompiled net takes the checkpoint as it is
    x = cli.datamodule.split_tensors("test")[0][:16]
    cli.model.load_state_dict(state)
    with torch.no_grad():
        torch.testing.assert_close(plain(x), cli.model.eval()(x))


BAD_INPUTS = [
    # (extra CLI args, text the error must contain)
    (["--model.optimizer.lr=abc"], "error: model.optimizer.lr: Given value: abc (torch.optim.AdamW)"),
    (["--model.optimizer.lrr=3"], "error: model.optimizer.lrr: Option 'lrr' is not accepted (torch.optim.AdamW)"),
    (["--model.lrr=0.1"], "error: model.lrr: Option 'lrr' is not accepted"),
    (["--model.net.init_args.dropout=x"], "error: model.net.init_args.dropout: Expected a <class 'float'>"),
    (["--model.optimizer.lr=0"], "model.optimizer.lr=0.0: the peak learning rate must be > 0"),
    (["--model.optimizer.lr=-1"], "model.optimizer.lr=-1.0: the peak learning rate must be > 0"),
    (["--model.optimizer=SparseAdam"], "model.optimizer=SparseAdam: it takes sparse gradients only"),
    (["--model.optimizer=Adamw"], "model.optimizer=Adamw: no torch.optim optimizer has that name; give one of"),
    (
        ["--model.optimizer=LBFGS"],
        "model.optimizer: LBFGS doesn't support per-parameter options (parameter groups), which the recipe uses",
    ),
    (["--model.schedule=Cosine"], "model.schedule=Cosine: no schedule has that name; give one of WarmupCosine"),
    (
        ["--model.optimizer=torch.optim.Adamw"],
        "model.optimizer=torch.optim.Adamw: module 'torch.optim' has no attribute 'Adamw'; give one of ASGD,",
    ),
    (["--model.schedule=mine.Cosine"], "model.schedule=mine.Cosine: No module named 'mine'; give one of WarmupCosine"),
    (["--model.schedule.min_lr=1.0"], "model.schedule.min_lr=1.0: the floor must lie in [0, the optimizer's lr"),
    (
        ["--model.schedule=project.recipe.WarmupStableDecay", "--model.schedule.decay_fraction=0"],
        "model.schedule.decay_fraction=0",
    ),
    (
        ["--model.schedule=project.recipe.WarmupStableDecay", "--model.schedule.shape=sqrt"],
        "error: model.schedule.shape: sqrt is not one of 'linear', '1-sqrt', 'cosine' (project.recipe.WarmupStable",
    ),
    (["--model.warmup=1.5"], "model.warmup=1.5"),
    (["--model.warmup=-3"], "model.warmup=-3"),
    (["--data.batch_size=0"], "data.batch_size=0"),
    (["--data.val_fraction=0.0"], "data.val_fraction=0.0"),
    (["--data.test_fraction=1.2"], "data.test_fraction=1.2"),
    (["--data.val_fraction=0.5", "--data.test_fraction=0.5"], "data.val_fraction + data.test_fraction"),
    (["--trainer.max_epochs=null"], "trainer.max_epochs"),
    (["--trainer.use_distributed_sampler=true"], "trainer.use_distributed_sampler=true"),
    (["--model=toy.Regressor"], "learns from values, but data.class_path=Digits serves classes"),
    # One listed callback's argument set, or the callback switched off, by a key of its own: a name or an argument
    # that is not there, or a value of the wrong type, is named.
    (
        ["--callback.TaskEarlyStoping=false"],
        "error: callback.TaskEarlyStoping: trainer.callbacks lists no "
        "TaskEarlyStoping; it lists DivergenceGuard, TaskCheckpoint, LastCheckpoint, TaskEarlyStopping",
    ),
    (
        ["--callback.TaskEarlyStopping.patiense=2"],
        "error: callback.TaskEarlyStopping.patiense: TaskEarlyStopping "
        "takes no argument 'patiense'; it takes monitor, mode, min_delta, patience",
    ),
    (
        ["--callback.LastCheckpoint.every_n_train_steps=often"],
        "error: callback.LastCheckpoint.every_n_train_steps='often': expected int or NoneType.",
    ),
    (["--callback.LastCheckpoint=true"], "error: callback.LastCheckpoint=True: false takes LastCheckpoint out of"),
    (
        ["--model.optimizer=torch.optim.LBFGS", "--model.param_groups=null", "--trainer.accumulate_grad_batches=2"],
        "error: model.optimizer=LBFGS with trainer.accumulate_grad_batches=2: LBFGS evaluates the loss several times",
    ),
    # A constructor that refuses its arguments (jsonargparse wraps its error in a page of union subtypes).
    (
        ["--trainer.profiler=lightning.pytorch.profilers.PyTorchProfiler", "--trainer.profiler.sort_by_key=total"],
        "error: lightning.pytorch.profilers.PyTorchProfiler: Found sort_by_key: total. Should be within {",
    ),
    (
        ["--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.monitor=val/acc", "--trainer.callbacks.mode=up"],
        "error: a lightning.pytorch.callbacks.callback.Callback of the config: `mode` can be min, max, got up",
    ),
]


@pytest.mark.guarantee(
    "a continuous target given to the classification path, or a task whose targets the data does not serve, is "
    "refused in one sentence naming the regression config"
)
@pytest.mark.guarantee("a run without `max_epochs`/`max_steps` is refused")
@pytest.mark.guarantee("bad config values exit 2 naming the key, leaving no run directory")
@pytest.mark.parametrize(("args", "message"), BAD_INPUTS, ids=[" ".join(a) for a, _ in BAD_INPUTS])
def test_bad_input_exits_non_zero_naming_the_key(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", DIGITS, f"--trainer.logger.init_args.save_dir={tmp_path}", *args])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "usage:" not in err  # the one sentence, not jsonargparse's page of usage before it
    assert not (tmp_path / "digits").exists()


@pytest.mark.guarantee(
    "one listed callback is switched off (`--callback.<Name>=false`) or one of its arguments set "
    "(`--callback.<Name>.<argument>=<value>`) without restating trainer.callbacks"
)
def test_one_listed_callback_is_switched_off_or_set_by_one_key(tmp_path: Path) -> None:
    from lightning.pytorch.callbacks import EarlyStopping

    from project.engine import CLI

    common = ["--config", DIGITS, f"--trainer.logger.init_args.save_dir={tmp_path}"]
    listed = CLI([*common, "--callback.TaskEarlyStopping.patience=2"], run=False).trainer.callbacks
    (stopping,) = [cb for cb in listed if isinstance(cb, EarlyStopping)]
    assert stopping.patience == 2
    without = CLI([*common, "--callback.TaskEarlyStopping=false"], run=False).trainer.callbacks
    assert not [cb for cb in without if isinstance(cb, EarlyStopping)]
    assert [type(cb) for cb in without] == [type(cb) for cb in listed if cb is not stopping]  # only it went


@pytest.mark.guarantee(
    "the recipe as it runs is printed as training starts (the optimizer and its groups' arguments, the schedule with "
    "the run's length and warmup, clipping, accumulation); switching the optimizer's class on the command line names "
    "the arguments it keeps from the config's"
)
def test_the_recipe_as_it_runs_is_printed_and_a_switched_optimizer_names_what_it_keeps(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from project.engine.run.parser import carried_over

    caplog.set_level(logging.INFO)
    # 4 batches in windows of 2: 2 optimizer steps; warmup 0.05 of them rounds up to 1 (tests/configs/digits.yaml).
    cli = fit(tmp_path, "--trainer.max_epochs=1", "--trainer.limit_train_batches=4", "--trainer.limit_val_batches=1",
              "--trainer.limit_test_batches=1", "--trainer.accumulate_grad_batches=2", "--model.net=toy.BackboneNet",
              "--model.backbone_lr_scale=0.1", "--model.optimizer=SGD", "--model.optimizer.momentum=0.9")  # fmt: skip
    log = caplog.text
    assert "model.optimizer=SGD keeps lr=0.003, weight_decay=0.05 from the config's optimizer" in log  # not momentum
    assert "Optimizer: SGD(lr=0.003, momentum=0.9, dampening=0, weight_decay=0.05); groups: backbone/decay (1 " in log
    assert "backbone/no_decay (3 tensors, weight_decay=0, lr_scale=0.1), head/decay (1 tensors)" in log
    assert "Schedule: WarmupCosine(min_lr=1e-05) per optimizer step, 2 steps, 1 of warmup" in log
    assert "Clipping: by norm at 1.0; accumulation: 2 batch(es) per optimizer step" in log
    optimizer = cli.config.fit.model.init_args.optimizer
    assert carried_over(["--model.optimizer.lr=0.1"], optimizer) is None  # no class switched: nothing carried over
    given = ["--model.optimizer=SGD", "--model.optimizer.lr=0.1", "--model.optimizer.momentum=0.9",
             "--model.optimizer.weight_decay=0.05"]  # fmt: skip
    assert carried_over(given, optimizer) is None  # every argument it kept given again


@pytest.mark.guarantee("a net whose only arguments are the ones linked from the data (input_shape, num_outputs) trains")
def test_a_net_taking_only_the_linked_arguments_trains(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Lightning's instantiator asserted on such a net's dumped config, which has no init_args of its own.
    (tmp_path / "your_minimal_net.py").write_text(
        "import math\n\nfrom torch import nn\n\n\nclass Net(nn.Module):\n"
        "    def __init__(self, input_shape: tuple[int, ...], num_outputs: int) -> None:\n"
        "        super().__init__()\n        self.out = nn.Linear(math.prod(input_shape), num_outputs)\n\n"
        "    def forward(self, x):\n        return self.out(x.flatten(1))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    cli = fit(tmp_path, "--model.net=your_minimal_net.Net", configs=(DIGITS, DEBUG))
    assert cli.trainer.global_step == 5 and cli.model.net.out.out_features == 10


# A net of the user's own with a mistake where Python finds it: importing its file, or building the net.
YOUR_NETS = {
    "importing": ("from torch import nn\n\n\nclass Net(nn.Module):\n    def forward(self, x: Any) -> Any:\n"
                  "        return x\n", 5, "def forward(self, x: Any) -> Any:", "in Net: NameError: name 'Any' is not"
                  " defined (importing the class that model.net names)"),
    "building": ("from torch import nn\n\n\nclass Net(nn.Module):\n    def __init__(self) -> None:\n"
                 "        super().__init__()\n        self.out = nn.Linear(64, hidden)\n", 7,
                 "self.out = nn.Linear(64, hidden)", ".Net.__init__: NameError: name 'hidden' is not defined"),
}  # fmt: skip


@pytest.mark.guarantee(
    "an error raised while importing or building a class of your own names your file, its line and the exception, "
    "exit 2"
)
@pytest.mark.parametrize("when", list(YOUR_NETS))
def test_an_error_in_your_own_code_names_your_file_and_line(
    when: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, line, source, said = YOUR_NETS[when]
    module = f"your_net_{when}"  # a name of its own: a module imported by another test is not imported again
    (tmp_path / f"{module}.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", DIGITS, f"--trainer.logger.init_args.save_dir={tmp_path}",
              f"--model.net={module}.Net"])  # fmt: skip
    assert exit_info.value.code == 2
    (error,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert error.startswith(f"error: {tmp_path / module}.py, line {line} (`{source}`)")
    assert error.endswith(said), error
    assert not (tmp_path / "digits").exists()


def test_the_command_line_is_read_without_a_warning_and_a_bare_optimizer_name_is_torchs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from project.engine import CLI

    argv = ["--config", DIGITS, "--model.optimizer=SGD", f"--trainer.logger.init_args.save_dir={tmp_path}"]
    monkeypatch.setattr(sys, "argv", ["python -m project", *argv])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cli = CLI(run=False)
    # LightningCLI warns when given arguments beside a command line's (as the rewritten optimizer name once was).
    assert not [w.message for w in caught if "args" in str(w.message)]
    assert cli.config.model.init_args.optimizer.class_path == "torch.optim.SGD"


def test_an_overlay_appends_a_callback_with_callbacks_plus(tmp_path: Path) -> None:
    """A list in a later file replaces the earlier one; ``callbacks+:`` appends to it instead (jsonargparse)."""
    from project.engine import CLI

    overlay = tmp_path / "more.yaml"
    overlay.write_text("trainer:\n  callbacks+:\n    - class_path: lightning.pytorch.callbacks.ModelSummary\n")
    listed = yaml.safe_load(Path(DIGITS).read_text())["trainer"]["callbacks"]
    cli = CLI(
        ["--config", DIGITS, "--config", str(overlay), f"--trainer.logger.init_args.save_dir={tmp_path}"], run=False
    )
    names = [str(cb.class_path) for cb in cli.config.trainer.callbacks]
    assert names == [cb["class_path"] for cb in listed] + ["lightning.pytorch.callbacks.ModelSummary"]


def test_unknown_key_in_a_config_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  lrr: 0.1\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", DIGITS, "--config", str(bad)])
    assert exit_info.value.code == 2
    assert "lrr" in capsys.readouterr().err


@pytest.mark.guarantee("bad config values exit 2 naming the key, leaving no run directory")
@pytest.mark.slow
def test_warmup_longer_than_the_run_is_refused_and_leaves_no_run_behind(tmp_path: Path) -> None:
    # Only known once the run length is (a debug run has 5 optimizer steps); found by the real entry point.
    result = run_module(
        "fit", "--config", DIGITS, "--config", DEBUG, f"--trainer.logger.init_args.save_dir={tmp_path}",
        "--model.warmup=5", forked=True,
    )  # fmt: skip
    assert result.returncode == 2
    assert "model.warmup resolves to 5 warmup steps, but the run has only 5 optimizer steps" in result.stderr
    assert not (tmp_path / "debug").exists()


@pytest.mark.guarantee(
    "a `configs/default.yaml` reading data the checkout lacks (a user's table; `data/` is git-ignored) is named in "
    "one sentence, and the contract suite's default subject and the data notebook skip on it"
)
def test_a_default_config_reading_data_the_checkout_lacks_is_named_in_one_sentence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import conftest

    # A checkout of its own (tmp_path), so a repository that has its data/churn.csv tests the same.
    yours = tmp_path / "default.yaml"
    yours.write_text("data:\n  class_path: yours.Churn\n  init_args:\n    path: data/churn.csv\n")
    monkeypatch.setattr(conftest, "USER_DEFAULT", str(yours))
    why = conftest.default_data_missing(root=tmp_path)  # what the contract suite and the data notebook skip on
    assert why is not None and why.startswith("configs/default.yaml reads data.path='data/churn.csv', which this")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "churn.csv").write_text("id,churned\n1,0\n")  # the data, there
    assert conftest.default_data_missing(root=tmp_path) is None


@pytest.mark.slow
@pytest.mark.guarantee(
    "what runs is what the config lists: no callback or plugin is added behind it; leaving out "
    "`AtomicCheckpointIO`, `LastCheckpoint`, `Provenance`, `TrackerRun` or the prediction writer loses its guarantee, "
    "one line each says so"
)
def test_what_runs_is_what_the_config_lists(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from project.engine import AtomicCheckpointIO, DivergenceGuard, LastCheckpoint, Provenance, ValidateTheLastStep

    def ours(cli: Any) -> list[type]:
        kinds = [type(cb) for cb in cli.trainer.callbacks if type(cb).__module__.startswith(f"{PACKAGE}.")]
        return [*kinds, type(cli.trainer.strategy.checkpoint_io)]

    from project.engine import TrackerRun

    # A tracker (any Lightning logger: a CSVLogger needs no extra) beside the run directory's logger.
    tracked = tmp_path / "tracked.yaml"
    tracked.write_text(yaml.safe_dump({"trackers": [{"class_path": "lightning.pytorch.loggers.CSVLogger",
                                                     "init_args": {"save_dir": str(tmp_path / "csv")}}]}))  # fmt: skip
    listed = fit(tmp_path / "listed", configs=(DIGITS, DEBUG, str(tracked)))  # the config lists all six
    guaranteed = {LastCheckpoint, Provenance, AtomicCheckpointIO, ValidateTheLastStep, TrackerRun, DivergenceGuard}
    assert guaranteed <= set(ours(listed))
    assert "leaves out" not in caplog.text and (Path(listed.trainer.log_dir) / "trackers.json").is_file()
    # Left out of the config: not added behind its back, and one line each says what is lost.
    callbacks = [cb for cb in yaml.safe_load(Path(DIGITS).read_text())["trainer"]["callbacks"]
                 if not cb["class_path"].endswith(("LastCheckpoint", "Provenance", "ValidateTheLastStep",
                                                   "CSVPredictionWriter", "TrackerRun",
                                                   "DivergenceGuard"))]  # fmt: skip
    overlay = tmp_path / "without.yaml"
    overlay.write_text(yaml.safe_dump({"trainer": {"callbacks": callbacks, "plugins": None}}))
    bare = fit(tmp_path / "bare", configs=(DIGITS, DEBUG, str(tracked), str(overlay)))
    assert not guaranteed & set(ours(bare))
    assert not (Path(bare.trainer.log_dir) / "trackers.json").exists()
    lost = [line for line in caplog.text.splitlines() if f"leaves out {PACKAGE}.engine." in line]
    named = ("AtomicCheckpointIO", "LastCheckpoint", "DivergenceGuard", "ValidateTheLastStep", "Provenance",
             "TrackerRun")  # fmt: skip
    assert [n for n in named if any(n in line for line in lost)] == list(named) and len(lost) == 6
    # predict likewise: a config without a prediction writer writes no predictions, and one line says so.
    run = Path(bare.trainer.log_dir)
    main(["predict", "--config", str(run / "config.yaml"), f"--ckpt_path={run / 'checkpoints' / 'best.ckpt'}"])
    assert "lists no prediction writer" in caplog.text and not (run / "predictions.csv").exists()
