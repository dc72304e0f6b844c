"""`make lr-find`: Lightning's LR range test on the config's own task, data and optimizer, its plot in the run
directory and a suggestion printed with the flag that uses it; Lightning's own callback, listed, ends in one
sentence."""

import json
import re
from pathlib import Path

import pytest
from conftest import DIGITS, ROOT

from project.engine import CLI, main
from project.engine.run.lr_find import lr_find
from project.engine.run.lr_find import main as lr_find_main

pytestmark = pytest.mark.slow
GAN = str(ROOT / "tests" / "configs" / "gan.yaml")


@pytest.mark.guarantee(
    "`make lr-find` runs the range test on the config's task, data and optimizer, writes its plot into the run "
    "directory and prints the suggested lr with a flag that the CLI takes as the optimizer's lr"
)
def test_lr_find_writes_its_plot_and_suggests_a_flag_the_cli_takes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    suggestion = lr_find(["--config", DIGITS, f"--trainer.logger.init_args.save_dir={tmp_path}"], 1e-5, 1.0, 40)
    assert 1e-5 <= suggestion <= 1.0
    run = tmp_path / "digits" / "version_0"
    assert (run / "lr_find.png").read_bytes().startswith(b"\x89PNG")
    record = json.loads((run / "provenance.json").read_text())["segments"][-1]
    assert record["status"] == f"lr range test: suggested lr {suggestion:.3g}" and record["ended"]
    (flag,) = re.findall(r"make train ARGS='(--model\.optimizer\.init_args\.lr=\S+)'", capsys.readouterr().out)
    cli = CLI(["--config", DIGITS, flag], run=False)
    assert cli.model.optimizer.keywords["lr"] == float(f"{suggestion:.3g}")  # what the flag sets is the lr


def test_lr_find_refuses_a_task_that_steps_its_optimizers_itself(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        lr_find_main(["--config", DIGITS, "--config", GAN, "--trainer.logger=false"])
    assert exit_.value.code == 2
    assert "GAN steps its optimizers itself (manual optimization)" in capsys.readouterr().err


@pytest.mark.guarantee(
    "Lightning's LearningRateFinder callback, listed (Lightning #16787), ends in one sentence that names make lr-find"
)
def test_lightnings_lr_finder_callback_ends_in_one_sentence_naming_make_lr_find(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--config", DIGITS, f"--trainer.logger.init_args.save_dir={tmp_path}",
              "--trainer.callbacks+=lightning.pytorch.callbacks.LearningRateFinder"])  # fmt: skip
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    (said,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert said.startswith("error: Lightning's LearningRateFinder callback") and "make lr-find" in said
