"""The image-folder example (project/data/images.py) and the ResNet for real images: what it reads, the
class names it keeps, and one clear error for each bad input."""

import re
import shutil
from pathlib import Path

import pytest
import torch
from conftest import DIGITS, IMAGES

from project.data import ImageFolderDataModule
from project.engine import ConfigError, main

pytestmark = [
    pytest.mark.guarantee(
        "the image folder and CSV DataModules keep class names, decode like predict, decode the same in worker "
        "processes, and refuse a bad folder, corrupt image, bad column or row naming it; `ResNet` takes any image "
        "size; a 29-line DataModule of your own trains and predicts"
    ),
]


def test_image_folder_reads_classes_from_subfolders_and_decodes_like_predict(image_folder: Path) -> None:
    dm = ImageFolderDataModule(root=str(image_folder), image_size=(6, 10))
    assert dm.target_names == ["circle", "square", "triangle"] and dm.input_shape == (3, 6, 10)
    dm.setup("fit")
    inputs, _ = dm.split_tensors("test")
    assert inputs.shape[1:] == (3, 6, 10) and inputs.min() >= 0 and inputs.max() <= 1
    assert torch.bincount(torch.cat([dm.split_tensors(s)[1] for s in ("train", "val", "test")])).tolist() == [40] * 3
    # predict decodes a file exactly as training does: the test split's own files give its tensors back.
    test_files = [dm.files[i][0] for i in dm.test_set.indices]  # type: ignore[union-attr]
    assert torch.equal(torch.stack([dm.load_predict_inputs(f)[0] for f in test_files[:4]]), inputs[:4])
    gray = ImageFolderDataModule(root=str(image_folder), image_size=8, grayscale=True)
    assert gray.input_shape == (1, 8, 8)


def test_image_loading_in_worker_processes_gives_the_same_batches(image_folder: Path) -> None:
    batches = []
    for workers in (0, 2):
        dm = ImageFolderDataModule(root=str(image_folder), image_size=8, num_workers=workers, batch_size=32)
        dm.setup("fit")
        batches.append(list(dm.val_dataloader()))
    for (x0, y0), (x2, y2) in zip(*batches, strict=True):
        assert torch.equal(x0, x2) and torch.equal(y0, y2)


def test_augmentation_flips_training_images_only(image_folder: Path) -> None:
    plain = ImageFolderDataModule(root=str(image_folder), image_size=8)
    flipping = ImageFolderDataModule(root=str(image_folder), image_size=8, augment=True)
    for dm in (plain, flipping):
        dm.setup("fit")
    torch.manual_seed(0)
    x, _ = flipping.split_tensors("train")
    x_plain, _ = plain.split_tensors("train")
    flipped = [torch.equal(a, b.flip(-1)) and not torch.equal(a, b) for a, b in zip(x, x_plain, strict=True)]
    assert 0.3 < sum(flipped) / len(flipped) < 0.7  # each image flipped with probability 1/2
    assert torch.equal(flipping.split_tensors("test")[0], plain.split_tensors("test")[0])


def _folder(tmp_path: Path, image_folder: Path) -> Path:
    root = tmp_path / "images"
    shutil.copytree(image_folder, root)
    return root


@pytest.mark.parametrize("case", ["missing", "empty-class", "one-class"])
def test_a_bad_image_folder_is_refused_naming_it(case: str, image_folder: Path, tmp_path: Path) -> None:
    root = _folder(tmp_path, image_folder)
    if case == "missing":
        root, message = tmp_path / "nowhere", "no such folder"
    elif case == "empty-class":
        (root / "hexagon").mkdir()
        message = "the class folder 'hexagon' holds no images"
    else:
        shutil.rmtree(root / "square")
        shutil.rmtree(root / "triangle")
        message = "found 1 class subfolder(s) with images; classification needs at least 2"
    with pytest.raises(ConfigError, match=re.escape(message)) as error:
        ImageFolderDataModule(root=str(root))
    assert str(root) in str(error.value)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_a_corrupt_image_stops_the_run_naming_the_file(
    workers: int, image_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _folder(tmp_path, image_folder)
    bad = root / "circle" / "0007.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n but not really")
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", DIGITS, "--config", IMAGES, f"--data.root={root}", f"--data.num_workers={workers}",
              f"--trainer.logger.init_args.save_dir={tmp_path}"])  # fmt: skip
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"error: '{bad}' is not a readable image" in err and "Traceback" not in err
    assert not list(tmp_path.glob("images/version_*"))  # no run directory left behind
