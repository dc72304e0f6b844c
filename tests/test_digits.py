"""The digits example (project/data/digits.py): predict reads your own files (.npy, .csv, a folder of images) as
the training data, and refuses values it cannot be."""

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import DEBUG, DIGITS, ROOT, fit
from PIL import Image
from test_predict_export import _predict  # the engine tests' predict: the prediction file's rows

pytestmark = pytest.mark.slow
# The shipped Classifier on the shipped digits DataModule, over the engine tests' config.
EXAMPLE = (str(ROOT / "configs" / "tasks" / "classification.yaml"), str(ROOT / "configs" / "data" / "digits.yaml"))


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("trained")
    fit(base, "--trainer.max_epochs=3", "--trainer.limit_train_batches=10", "--trainer.limit_test_batches=1.0",
        configs=(DIGITS, *EXAMPLE, DEBUG))  # fmt: skip
    return base / "debug" / "version_0"


@pytest.fixture(scope="module")
def test_images(run: Path) -> tuple[torch.Tensor, torch.Tensor]:
    from project.data import DigitsDataModule

    dm = DigitsDataModule.load_from_checkpoint(run / "checkpoints" / "best.ckpt", weights_only=True)
    dm.setup("test")
    return dm.split_tensors("test")


@pytest.mark.guarantee(
    "predict on the digits' own file formats (.npy, .csv, image folders) equals predict on the test split",
)
def test_predict_on_your_own_files(run: Path, test_images: tuple, tmp_path: Path) -> None:
    images, _ = test_images
    expected = [r["predicted_class"] for r in _predict(run)][:12]
    np.save(tmp_path / "inputs.npy", images[:12].reshape(12, 64).numpy())
    np.savetxt(tmp_path / "inputs.csv", images[:12].reshape(12, 64).numpy(), delimiter=",")
    folder = tmp_path / "pngs"
    folder.mkdir()
    for i, image in enumerate(images[:12]):  # a dark digit on white paper, 32x32 pixels
        pixels = np.kron((255 * (1 - image[0].numpy())).round().astype(np.uint8), np.ones((4, 4), np.uint8))
        Image.fromarray(pixels, mode="L").save(folder / f"{i:02d}.png")
    for source in (tmp_path / "inputs.npy", tmp_path / "inputs.csv", folder):
        rows = _predict(run, f"--data.predict_path={source}")
        assert [r["predicted_class"] for r in rows] == expected, source.name


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (np.full((2, 64), 16.0, np.float32), "values must be finite and in [0, 1]"),
        ("not,numbers\n", "could not be read as numbers"),
    ],
    ids=["wrong-scale", "not-numbers"],
)
def test_values_the_digits_cannot_be_are_refused(
    run: Path, tmp_path: Path, content: object, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / ("bad.csv" if isinstance(content, str) else "bad.npy")
    if isinstance(content, str):
        path.write_text(content)
    else:
        np.save(path, content)
    with pytest.raises(SystemExit) as exit_info:
        _predict(run, f"--data.predict_path={path}")
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"data.predict_path='{path}'" in err and message in err and "Traceback" not in err
