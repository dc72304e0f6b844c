"""The manual's own Dataset in one file (project/data/moons.py): it trains, predicts, and is the manual's."""

import csv
from pathlib import Path

import manual  # scripts/ (conftest puts it on the path)
import numpy as np
import pytest
from conftest import DEBUG, DIGITS, ROOT, fit, scalars

from project.engine import main

pytestmark = [
    pytest.mark.guarantee(
        "the image folder and CSV DataModules keep class names, decode like predict, decode the same in worker "
        "processes, and refuse a bad folder, corrupt image, bad column or row naming it; `ResNet` takes any image "
        "size; a 29-line DataModule of your own trains and predicts"
    ),
]


@pytest.mark.manual  # the template's manual shows the file: `make check-manual`, not `make test`
def test_your_own_dataset_in_one_file_is_the_one_the_manual_shows() -> None:
    source = (ROOT / "project" / "data" / "moons.py").read_text()
    body = source[source.index("from typing") :].strip()
    assert body in manual.text(ROOT), "the manual's Make it yours example differs from the tested file"


@pytest.mark.slow
def test_your_own_dataset_in_one_file_trains_and_predicts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cli = fit(tmp_path, "--data=project.data.moons.MoonsDataModule", "--data.normalize=true",
              "--model.net=project.nets.MLP", "--trainer.max_epochs=15", configs=(DIGITS, DEBUG))  # fmt: skip
    run = Path(cli.trainer.log_dir)
    ((_, test_acc),) = scalars(run)["test/acc"]
    assert test_acc > 0.9  # two moons with noise 0.2: a small MLP separates them (chance is 0.5)
    points = tmp_path / "points.npy"
    np.save(points, np.array([[0.0, 1.0], [1.0, -0.5]], np.float32))  # the top of the upper moon, the lower's bottom
    main(["predict", "--config", str(run / "config.yaml"), f"--ckpt_path={run / 'checkpoints' / 'best.ckpt'}",
          f"--data.predict_path={points}"])  # fmt: skip
    with open(run / "predictions.csv") as f:
        assert [row["predicted_class"] for row in csv.DictReader(f)] == ["upper", "lower"]
