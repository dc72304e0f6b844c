"""Projects of other shapes than (one input tensor, targets), on the engine's own fixtures (tests/shapes.py): what the
contract suite does not already prove on its two_inputs, contrastive and gan subjects. A task with several
optimizers counts one step per batch, its schedules reach their floor at max_steps, it clips as the config says and
refuses accumulation in one sentence; a task declares only guarantees the contract suite has; a metric's direction
is torchmetrics' higher_is_better."""

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import DIGITS, PYTHONPATH, ROOT, fit, run_ranks, scalars, scratch_dir, warmup_cosine
from shapes import TwoInputs, Unlabelled
from torchmetrics import Metric
from toy import Digits

from project.engine import CLI, ConfigError
from project.engine.model.task import PROMISES, Task

GAN = str(ROOT / "tests" / "configs" / "gan.yaml")

pytestmark = pytest.mark.guarantee(
    "a task with several optimizers (a GAN, manual optimization) counts one step per batch (not Lightning's one per "
    "optimizer.step(), Lightning #17958): `max_steps` batches run and each schedule reaches its floor at the last; "
    "it clips as `trainer.gradient_clip_val` says, and accumulation is refused in one sentence"
)


@pytest.mark.slow
def test_a_task_with_two_optimizers_counts_batches_and_its_schedules_end_at_their_floor(tmp_path: Path) -> None:
    cli = fit(tmp_path, "--trainer.max_steps=40", "--trainer.max_epochs=-1", "--trainer.log_every_n_steps=1",
              "--trainer.limit_val_batches=0", configs=(DIGITS, GAN))  # fmt: skip
    batches = cli.trainer.fit_loop.epoch_loop.batch_progress.total.completed
    assert cli.trainer.global_step == batches == 40
    curves = scalars(cli.trainer.log_dir)
    warmup = math.ceil(0.05 * 40)  # the config's model.warmup, a fraction of the run's 40 steps
    for part, peak in (("discriminator", 0.001), ("generator", 0.002)):  # tests/configs/gan.yaml's lr
        logged = curves[f"lr-{part}/decay"]
        assert [step for step, _ in logged] == list(range(40))
        expected = [warmup_cosine(step, peak, 1e-5, warmup, 40) for step in range(40)]
        # float32 in the event file: ~6e-8 relative.
        assert [lr for _, lr in logged] == pytest.approx(expected, rel=1e-6)
        assert logged[-1][1] == pytest.approx(1e-5, rel=1e-6)  # the floor, at the last of the 40 batches


@pytest.mark.slow
@pytest.mark.guarantee(
    "a task with several optimizers counts batches, whichever part steps in them: trained in stages, its "
    "global_step, checkpoints and schedules go on after the first part stops"
)
def test_a_task_trained_in_stages_counts_every_batch_after_its_first_part_stops(tmp_path: Path) -> None:
    cli = fit(tmp_path, "--model.class_path=shapes.StagedGAN", "--model.init_args.switch_at=3",
              "--trainer.max_epochs=2", "--trainer.limit_train_batches=6", "--trainer.limit_val_batches=2",
              "--trainer.limit_test_batches=2", configs=(DIGITS, GAN))  # fmt: skip
    assert cli.model.steps == {"discriminator": 3, "generator": 9}
    assert cli.trainer.global_step == 12  # 2 epochs of 6 batches, not the discriminator's 3 steps
    last = torch.load(Path(cli.trainer.log_dir) / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["global_step"] == 12
    discriminator, generator = cli.trainer.lr_scheduler_configs
    assert (discriminator.scheduler.last_epoch, generator.scheduler.last_epoch) == (3, 9)  # each when its part steps


@pytest.mark.slow
@pytest.mark.guarantee(
    "a task that steps its optimizers itself (`opt.step()`, `sch.step()`) counts batches too: `max_steps` is "
    "batches and each schedule ends at its floor"
)
def test_a_task_stepping_its_optimizers_itself_counts_batches_too(tmp_path: Path) -> None:
    cli = fit(tmp_path, "--model.class_path=shapes.OwnStepsGAN", "--trainer.max_steps=20", "--trainer.max_epochs=-1",
              "--trainer.limit_val_batches=0", configs=(DIGITS, GAN))  # fmt: skip
    batches = cli.trainer.fit_loop.epoch_loop.batch_progress.total.completed
    assert cli.trainer.global_step == batches == 20  # not 10 batches of two steps each
    for config in cli.trainer.lr_scheduler_configs:  # each schedule at its floor: 1e-5 times its group's ratio
        assert config.scheduler.get_last_lr()[0] == pytest.approx(1e-5, rel=1e-6)


@pytest.mark.slow
def test_a_task_with_two_optimizers_clips_as_the_trainer_config_says(tmp_path: Path) -> None:
    """One SGD step at a constant lr (no momentum, no decay) moves the discriminator by lr x its clipped gradient,
    whose norm is the config's gradient_clip_val when the raw one is larger: a closed form."""
    lr, clip = 0.1, 1e-3
    sgd = {"class_path": "torch.optim.SGD", "init_args": {"lr": lr, "weight_decay": 0.0}}
    cli = CLI(["--config", DIGITS, "--config", GAN, f"--trainer.logger.init_args.save_dir={tmp_path}",
               f"--model.optimizers={{'discriminator': {sgd}, 'generator': {sgd}}}",
               "--model.schedule=project.recipe.WarmupConstant", "--model.warmup=0", "--trainer.max_steps=1",
               f"--trainer.gradient_clip_val={clip}"], run=False)  # fmt: skip
    assert cli.trainer.gradient_clip_val is None  # Lightning refuses its own for manual optimization
    before = torch.cat([p.detach().flatten().clone() for p in cli.model.net.discriminator.parameters()])
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    after = torch.cat([p.detach().flatten() for p in cli.model.net.discriminator.parameters()])
    # clip_grad_norm_ scales by clip / (norm + 1e-6): 1e-6 / norm relative short of clip, for a raw norm >> clip.
    assert (after - before).norm().item() == pytest.approx(lr * clip, rel=1e-3)


def test_accumulation_with_manual_optimization_is_refused_in_one_sentence(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"trainer.accumulate_grad_batches=2: GAN steps its optimizers itself"):
        CLI(["--config", DIGITS, "--config", GAN, f"--trainer.logger.init_args.save_dir={tmp_path}",
             "--trainer.accumulate_grad_batches=2"], run=False)  # fmt: skip


def test_optimizers_name_parts_of_the_net_under_manual_optimization(tmp_path: Path) -> None:
    adam = {"class_path": "torch.optim.Adam"}
    cli = CLI(["--config", DIGITS, "--config", GAN, f"--trainer.logger.init_args.save_dir={tmp_path}",
               f"--model.optimizers={{'critic': {adam}}}", "--trainer.max_steps=1"], run=False)  # fmt: skip
    with pytest.raises(ConfigError, match=r"'critic', which is no part of the net; its parts: \['generator', 'disc"):
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    cli = CLI(["--config", DIGITS, "--config", GAN, f"--trainer.logger.init_args.save_dir={tmp_path}",
               f"--model.optimizers={{'discriminator': {adam}}}", "--trainer.max_steps=2"], run=False)  # fmt: skip
    with pytest.raises(
        ConfigError, match=r"GAN.manual_step\('generator'\): model.optimizers names \['discriminator'\]"
    ):
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    cli = CLI(["--config", DIGITS, f"--trainer.logger.init_args.save_dir={tmp_path}",
               f"--model.optimizers={{'layers': {adam}}}", "--model.net=toy.MLP", "--trainer.max_steps=1"],
              run=False)  # fmt: skip
    with pytest.raises(
        ConfigError, match=r"leaves automatic_optimization on; set self\.automatic_optimization = False"
    ):
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)


def test_a_task_may_waive_only_the_contract_suites_guarantees() -> None:
    class InBatchNegatives(Task):
        cannot_promise = {"two_processes_equal_one": "each process's negatives are its own batch's"}  # noqa: RUF012

    assert set(InBatchNegatives.cannot_promise) <= set(PROMISES)
    with pytest.raises(TypeError, match=r"cannot_promise names \['resumes'\]: a task may waive only"):

        class Unknown(Task):
            cannot_promise = {"resumes": "no"}  # noqa: RUF012


class Undirected(Metric):
    """A metric of the user's own that does not say which way is better."""

    def __init__(self) -> None:
        super().__init__()
        self.add_state("total", torch.tensor(0.0), dist_reduce_fx="sum")

    def update(self, outputs: torch.Tensor, targets: torch.Tensor) -> None:
        self.total += outputs.sum()

    def compute(self) -> torch.Tensor:
        return self.total


class WithUndirected(Task):
    def configure_metrics(self):  # type: ignore[no-untyped-def]
        from torchmetrics import MetricCollection

        return MetricCollection({"mine": Undirected()})


def test_a_metric_without_a_direction_is_refused_naming_higher_is_better() -> None:
    with pytest.raises(ConfigError, match=r"Undirected does not say its direction \(torchmetrics' class attribute "
                                          r"higher_is_better is None\)"):  # fmt: skip
        WithUndirected(net=torch.nn.Linear(2, 2), monitor="val/mine")
    Undirected.higher_is_better = True
    try:
        assert WithUndirected(net=torch.nn.Linear(2, 2), monitor="val/mine").mode == "max"
    finally:
        Undirected.higher_is_better = None


class Bare(Digits):
    """Declares classes, but its samples are images alone."""

    def load_dataset(self):  # type: ignore[no-untyped-def]
        return [image for image, _ in super().load_dataset()]


class OneTuples(Unlabelled):
    """No targets, but its samples are 1-tuples (as a TensorDataset of images alone yields)."""

    def load_dataset(self):  # type: ignore[no-untyped-def]
        return [(image,) for image in super().load_dataset()]


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (Bare, r"Bare declares target_kind='classes', so a sample is \(inputs, target\), but its first training "
               r"sample is a tensor shaped \(1, 8, 8\)"),
        (OneTuples, r"OneTuples declares one input tensor \(input_shape=\(1, 8, 8\)\), but its first training "
                    r"sample's inputs are a tuple of 1 \(a tensor shaped \(1, 8, 8\)\): return the tensor itself"),
    ],
)  # fmt: skip
def test_a_sample_of_another_layout_than_declared_is_refused_in_one_sentence(data: type, said: str) -> None:
    with pytest.raises(ConfigError, match=said):
        data().setup("fit")
    two = TwoInputs()
    two.input_shape = {"image": (1, 8, 8), "table": (5,)}  # type: ignore[assignment]
    with pytest.raises(ConfigError, match=r"declares the named inputs \['image', 'table'\] \(its input_shape\), but "
                                          r"its first training sample's inputs are a dict with the keys \['image', "
                                          r"'tabular'\]"):  # fmt: skip
        two.setup("fit")


@pytest.mark.slow
def test_a_task_with_two_optimizers_trains_on_two_ddp_processes_from_one_flag(tmp_path: Path) -> None:
    ddp = ("--config", str(ROOT / "configs" / "ddp.yaml"), "--trainer.accelerator=cpu")
    with pytest.raises(
        ConfigError,
        match=r"trainer.strategy='ddp': each of GAN's optimizer steps leaves the other "
        r"parts' parameters unused, .* set trainer.strategy=ddp_find_unused",
    ):
        CLI(["--config", DIGITS, "--config", GAN, *ddp, f"--trainer.logger.init_args.save_dir={tmp_path}"],
            run=False)  # fmt: skip
    done = run_ranks("fit", "--config", DIGITS, "--config", GAN, *ddp, "--trainer.max_steps=6",
                     "--trainer.strategy=ddp_find_unused_parameters_true", "--trainer.max_epochs=-1",
                     "--data.test_fraction=0.1495",  # 269 test samples: 2 processes cannot share them evenly
                     f"--trainer.logger.init_args.save_dir={tmp_path}", cwd=scratch_dir())  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "gan" / "version_0"
    last = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["global_step"] == 6  # batches per process, each a step of both optimizers
    # The final test ran on 2 processes, each on its own share of the test split, samples without targets: its loss
    # is the one process's on the whole split (float32 sums in another order: ~1e-7 relative).
    one = CLI(["test", "--config", str(run / "config.yaml"), f"--ckpt_path={run / 'checkpoints' / 'best.ckpt'}",
               "--trainer.devices=1", "--trainer.strategy=auto", "--trainer.logger=false"])  # fmt: skip
    (_, on_two), *_ = scalars(run)["test/loss"]
    assert float(one.trainer.callback_metrics["test/loss"]) == pytest.approx(on_two, rel=1e-6)


def _whole_config(folder: Path, capsys: pytest.CaptureFixture[str], *args: str) -> Path:
    """The engine tests' config with ``args`` (overlays, flags) as a whole config of the user's, as `make train
    CONFIG=` takes one, composed by jsonargparse itself (--print_config)."""
    with pytest.raises(SystemExit) as exit_info:
        CLI(["--config", DIGITS, *args, "--print_config"], run=False)
    assert exit_info.value.code in (0, None), capsys.readouterr().err[-2000:]
    config = folder / "whole.yaml"
    config.write_text(capsys.readouterr().out)
    return config


def _contract_on(config: Path, selected: str) -> tuple[str, list[tuple[str, str]]]:
    """`make contract CONFIG=config` with the tests ``selected`` (pytest -k) in a process of its own: its output and
    (test, PASSED or SKIPPED) for each test it ran."""
    import subprocess
    import sys

    from conftest import PYTHONPATH

    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "-k", selected,
         str(ROOT / "tests" / "test_contract.py")],
        env={**os.environ, "PROJECT_CONTRACT_CONFIG": str(config), "PYTHONPATH": PYTHONPATH},
        cwd=config.parent, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:]
    return done.stdout, re.findall(r"test_contract\.py::(\S+) (PASSED|SKIPPED)", done.stdout)


@pytest.mark.guarantee(
    "the contract's equivalence runs switch off every dropout: `nn.Dropout*`, the attention dropout of "
    "`nn.MultiheadAttention` and `nn.Transformer*`, and a p a module hands to `F.scaled_dot_product_attention`"
)
def test_the_equivalence_runs_switch_off_every_dropout() -> None:
    from probes import NoDropout
    from torch import nn

    class OwnAttention(nn.Module):  # a module of one's own: its p is a number, handed to the functional op
        def __init__(self) -> None:
            super().__init__()
            self.attention_dropout = 0.1

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            p = self.attention_dropout if self.training else 0.0
            return nn.functional.scaled_dot_product_attention(x, x, x, dropout_p=p)

    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=True)
    net = nn.Sequential(nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), OwnAttention()).train()
    x = torch.randn(4, 8, 16)
    assert not torch.equal(net(x), net(x))  # dropout draws a mask per call
    NoDropout().setup(None, net, "fit")  # type: ignore[arg-type]
    assert torch.equal(net(x), net(x))  # in training mode still: nothing random is left


@pytest.mark.slow
@pytest.mark.guarantee("`make contract CONFIG=...` runs the contract suite on that config alone")
def test_the_contract_suite_runs_on_a_config_of_ones_own_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, ran = _contract_on(_whole_config(tmp_path, capsys, "--config", GAN), "declare or learns_one_batch")
    assert ran == [
        ("test_the_task_and_the_datamodule_declare_their_contracts[default]", "PASSED"),
        ("test_fit_learns_one_batch_by_heart[default]", "SKIPPED"),
    ]
    # The subject is the given config: the GAN's waiver is what skipped the second.
    assert "GAN cannot promise learns_one_batch_by_heart: adversarial" in out


@pytest.mark.slow
@pytest.mark.guarantee(
    "the contract suite runs on an owner's config whose warmup is a count of steps longer than the suite's runs: "
    "they take it as the fraction of the owner's run it is"
)
def test_the_contract_suite_takes_an_integer_warmup_as_its_share_of_the_owners_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _whole_config(tmp_path, capsys, "--model.warmup=49")  # an owner's run of 800 steps, 49 of warmup
    assert yaml.safe_load(config.read_text())["model"]["init_args"]["warmup"] == 49
    _, ran = _contract_on(config, "learns_one_batch")  # its run is 30 steps: a warmup of 49 would be refused
    assert ran == [("test_fit_learns_one_batch_by_heart[default]", "PASSED")]


@pytest.mark.slow
def test_a_forward_torch_export_cannot_trace_is_refused_in_one_paragraph(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import toy

    from project.engine.inference.export import export

    cli = fit(tmp_path, "--trainer.max_steps=2", "--trainer.max_epochs=1", "--trainer.limit_val_batches=0")
    checkpoint = Path(cli.trainer.log_dir) / "checkpoints" / "last.ckpt"
    # A forward whose outputs depend on the batch's size (as a split of the batch into two views would).
    monkeypatch.setattr(toy.Classifier, "forward", lambda self, x: self.net(x) * (2 if len(x) > 1 else 1))
    said = r"torch.export cannot trace Classifier's forward .* for any batch size: .*Each sample's outputs must not"
    with pytest.raises(ConfigError, match=said):
        export(checkpoint)
    # A Python decision on a tensor's value, in a net of the user's: torch prints the graphs it traced, pages of
    # them; `make export` (a process of its own, as the user runs it) says one sentence and keeps them in export.log.
    (tmp_path / "branchy.py").write_text(
        "import math\n\nfrom torch import nn\n\n\nclass Net(nn.Module):\n"
        "    def __init__(self, input_shape: tuple[int, ...], num_outputs: int) -> None:\n"
        "        super().__init__()\n        self.out = nn.Linear(math.prod(input_shape), num_outputs)\n\n"
        "    def forward(self, x):\n        y = self.out(x.flatten(1))\n        return y if y.sum() > 0 else -y\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    run = Path(fit(tmp_path / "branchy", "--trainer.max_steps=2", "--trainer.max_epochs=1",
                   "--trainer.limit_val_batches=0", "--model.net=branchy.Net").trainer.log_dir)  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), PYTHONPATH]), "PYTHONWARNINGS": "ignore"}
    export = [sys.executable, "-m", "project.engine.inference.export", str(run / "checkpoints" / "last.ckpt")]
    done = subprocess.run(export, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)  # fmt: skip
    checkpoint = run / "checkpoints" / "last.ckpt"
    assert done.returncode == 2 and done.stdout == "", done.stdout[-2000:]
    (line,) = done.stderr.splitlines()  # one sentence, not the traced graphs
    assert re.search(rf"{said}.* torch's full report: {checkpoint.parent}/export.log", line), line
    assert "def forward" in (checkpoint.parent / "export.log").read_text()  # the traced graph, kept


@pytest.mark.slow
def test_the_data_notebook_shows_a_config_without_targets_with_two_optimizers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from conftest import PYTHONPATH
    from test_notebooks import _execute, _images, _text

    config = _whole_config(tmp_path, capsys, "--config", GAN)
    notebook = _execute(ROOT / "notebooks" / "01_data_and_schedule.ipynb",
                        {"PROJECT_CONFIG": str(config), "PYTHONPATH": PYTHONPATH})  # fmt: skip
    assert _images(notebook) == 3  # samples, the splits' sizes, the first part's LR curve
    text = _text(notebook)
    assert "inputs: (64, 1, 8, 8) torch.float32" in text and "targets: none" in text
