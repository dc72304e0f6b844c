"""Semantic segmentation beyond what the contract suite checks on every task: the metrics and the loss against
hand computations, what the DataModule reads and refuses, the UNet's sizes, and the masks predict writes."""

import csv
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import DIGITS, SEGMENTATION, fit
from PIL import Image

from project.data import SegmentationFolderDataModule
from project.data.images import decode_image
from project.engine import CLI, ConfigError, main
from project.nets import UNet
from project.tasks import Segmenter

pytestmark = [
    pytest.mark.guarantee(
        "segmentation: `val/miou` and pixel `acc` equal a hand computation over the whole split (a class absent "
        "from truth and prediction left out, `ignore_index` pixels ignored), the loss each image's mean "
        "cross-entropy over its labelled pixels; masks resized by nearest neighbour and flipped with their images; "
        "each bad pair (no mask, no image, size mismatch, value beyond the classes, RGB mask, unreadable file) "
        "refused in one sentence naming the file, exit 2, no run directory; the UNet's outputs per pixel for any "
        "size divisible by 2**depth, independent of the batch; `predict` writes one mask per input at its size, "
        "the argmax of the model's outputs; the export outputs per-pixel logits named in `model.json`",
    ),
]

CLASSES = ["background", "circle", "square", "triangle"]


def _one_hot_logits(predicted: torch.Tensor, classes: int) -> torch.Tensor:
    """Logits (N, C, H, W) whose argmax is ``predicted`` (N, H, W)."""
    return torch.nn.functional.one_hot(predicted, classes).permute(0, 3, 1, 2).float() * 5.0


def test_miou_and_pixel_accuracy_are_their_hand_computation_over_the_whole_split() -> None:
    task = Segmenter(net=torch.nn.Identity(), target_names=CLASSES)
    targets = torch.tensor([[[0, 0, 1], [1, 2, 2]], [[0, 0, 0], [1, 1, 1]]])
    predicted = torch.tensor([[[0, 1, 1], [1, 2, 0]], [[0, 0, 0], [1, 2, 1]]])
    metrics = task.configure_metrics()
    for i in range(2):  # one image per batch: the epoch's value is over all pixels, not a mean of per-batch values
        task.update_metrics(metrics, _one_hot_logits(predicted[i : i + 1], 4), targets[i : i + 1])
    values = metrics.compute()
    # Over the 12 pixels (true, predicted): class 0: 4 agree, 5 true, 5 predicted: IoU 4 / (5 + 5 - 4) = 2/3;
    # class 1: 4 agree, 5 true, 5 predicted: 2/3; class 2: 1 agrees, 2 true, 2 predicted: 1/3; class 3 is in
    # neither, so it is left out of the mean (counted as 0 it would give 5/12). The mean of the two images' own
    # mIoUs would be (1/2 + 5/9) / 2 = 0.528. Pixel accuracy: 9 of 12 pixels.
    assert values["miou"].item() == pytest.approx(5 / 9, abs=1e-6)
    assert values["acc"].item() == pytest.approx(9 / 12, abs=1e-6)
    # Unlabelled pixels (ignore_index) count for nothing: the two wrong pixels of image 0 made unlabelled leave
    # class 0: 4 agree, 4 true, 4 predicted (IoU 1); class 1: 4, 5, 4 (4/5); class 2: 1, 1, 2 (1/2); acc 9/10.
    ignoring = Segmenter(net=torch.nn.Identity(), target_names=CLASSES, ignore_index=255)
    metrics = ignoring.configure_metrics()
    unlabelled = targets.clone()
    unlabelled[0, 0, 1] = unlabelled[0, 1, 2] = 255
    ignoring.update_metrics(metrics, _one_hot_logits(predicted, 4), unlabelled)
    values = metrics.compute()
    assert values["miou"].item() == pytest.approx((1 + 4 / 5 + 1 / 2) / 3, abs=1e-6)
    assert values["acc"].item() == pytest.approx(9 / 10, abs=1e-6)


def test_the_loss_is_each_images_mean_cross_entropy_over_its_labelled_pixels() -> None:
    task = Segmenter(net=torch.nn.Identity(), target_names=["a", "b", "c"], ignore_index=255)
    # Logit 2 for class 0 everywhere, 0 for the others: a pixel of class 0 costs log(e^2 + 2) - 2, of another class
    # log(e^2 + 2). Image 0: two pixels of class 0, two of class 1; image 1: one of class 2, three unlabelled.
    outputs = torch.zeros(2, 3, 2, 2)
    outputs[:, 0] = 2.0
    targets = torch.tensor([[[0, 0], [1, 1]], [[2, 255], [255, 255]]])
    z = np.log(np.exp(2) + 2)
    expected = torch.tensor([(2 * (z - 2) + 2 * z) / 4, z], dtype=torch.float32)
    torch.testing.assert_close(task.loss(outputs, targets), expected)


def _copy(folder: Path, tmp_path: Path) -> Path:
    root = tmp_path / "segmentation"
    shutil.copytree(folder, root)
    return root


def test_pairs_decode_at_image_size_masks_by_nearest_neighbour_and_flip_together(
    segmentation_folder: Path, tmp_path: Path
) -> None:
    dm = SegmentationFolderDataModule(root=str(segmentation_folder), image_size=(8, 12))
    assert dm.target_names == CLASSES and dm.input_shape == (3, 8, 12)
    dm.setup("fit")
    inputs, targets = dm.split_tensors("test")
    assert inputs.shape[1:] == (3, 8, 12) and targets.shape[1:] == (8, 12) and targets.dtype == torch.int64
    # The mask's own values, resized by nearest neighbour (a bilinear resize would invent values between them).
    first_image, first_mask = dm.pairs[dm.test_set.indices[0]]  # type: ignore[union-attr]
    with Image.open(first_mask) as mask:
        assert targets[0].tolist() == np.asarray(mask.resize((12, 8), Image.Resampling.NEAREST)).tolist()
    assert torch.equal(inputs[0], decode_image(first_image, (8, 12), grayscale=False))
    # Without classes.txt the names are the mask values 0..K-1, K = the largest value + 1.
    bare = _copy(segmentation_folder, tmp_path)
    (bare / "classes.txt").unlink()
    largest = max(int(np.asarray(Image.open(p)).max()) for p in (bare / "masks").iterdir())
    assert SegmentationFolderDataModule(root=str(bare)).target_names == [str(k) for k in range(largest + 1)]
    # augment flips a training pair's image and mask together, about half of them; val/test stay as they are.
    flipping = SegmentationFolderDataModule(root=str(segmentation_folder), image_size=(8, 12), augment=True)
    flipping.setup("fit")
    torch.manual_seed(0)
    (x, y), (x_plain, y_plain) = flipping.split_tensors("train"), dm.split_tensors("train")
    flipped = []
    for a, b, m, n in zip(x, x_plain, y, y_plain, strict=True):
        assert (torch.equal(a, b) and torch.equal(m, n)) or (torch.equal(a, b.flip(-1)) and torch.equal(m, n.flip(-1)))
        flipped.append(not torch.equal(a, b))
    assert 0.25 < sum(flipped) / len(flipped) < 0.75
    assert torch.equal(flipping.split_tensors("test")[1], targets)
    # Decoded in worker processes, the batches are the same.
    workers = SegmentationFolderDataModule(root=str(segmentation_folder), image_size=(8, 12), num_workers=2)
    workers.setup("fit")
    batches = list(workers.test_dataloader())
    assert torch.equal(torch.cat([b[0] for b in batches]), inputs)
    assert torch.equal(torch.cat([b[1] for b in batches]), targets)


def _spoil(root: Path, case: str) -> tuple[Path, str]:
    """Spoils the copied folder ``root`` one way: the file the error must name, and the words it must say."""
    if case == "image-without-mask":
        (root / "masks" / "0003.png").unlink()
        return root / "images" / "0003.png", "has no mask: expected"
    if case == "mask-without-image":
        (root / "images" / "0005.png").unlink()
        return root / "masks" / "0005.png", "is a mask without an image"
    if case == "size-mismatch":
        Image.new("L", (12, 16)).save(root / "masks" / "0002.png")
        return root / "masks" / "0002.png", "is 12x16 pixels but its image '0002.png' is 16x16"
    if case == "value-beyond-the-classes":
        Image.new("L", (16, 16), 7).save(root / "masks" / "0006.png")
        return root / "masks" / "0006.png", "holds the value 7, but"
    if case == "rgb-mask":
        Image.new("RGB", (16, 16)).save(root / "masks" / "0001.png")
        return root / "masks" / "0001.png", "is a RGB image; a mask must be single-channel"
    if case == "two-images-one-mask":
        shutil.copy(root / "images" / "0007.png", root / "images" / "0007.jpg")
        return root / "images" / "0007.png", "and '0007.jpg' share a name: a mask belongs to one image"
    if case == "unreadable-image":  # cut short, as by an interrupted copy: its header still reads
        path = root / "images" / "0004.png"
        path.write_bytes(path.read_bytes()[:-40])
        return path, "is not a readable image"
    assert case == "unreadable-mask"
    (root / "masks" / "0004.png").write_bytes(b"not a png")
    return root / "masks" / "0004.png", "is not a readable mask image"


CASES = ["image-without-mask", "mask-without-image", "size-mismatch", "value-beyond-the-classes", "rgb-mask",
         "two-images-one-mask", "unreadable-image", "unreadable-mask"]  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_a_bad_pair_is_refused_in_one_sentence_naming_the_file(
    case: str, segmentation_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad, words = _spoil(_copy(segmentation_folder, tmp_path), case)
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", DIGITS, "--config", SEGMENTATION, f"--data.root={tmp_path / 'segmentation'}",
              f"--trainer.logger.init_args.save_dir={tmp_path / 'logs'}"])  # fmt: skip
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    (line,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert line.startswith(f"error: '{bad}' ") and words in line, line
    assert line.count(". ") == 0 and line.endswith("."), line  # one sentence
    assert "Traceback" not in err and not (tmp_path / "logs").exists()  # nothing ran, no run directory


def test_the_task_and_the_data_must_ignore_the_same_mask_value(
    segmentation_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", DIGITS, "--config", SEGMENTATION, f"--data.root={segmentation_folder}",
              "--model.ignore_index=255", f"--trainer.logger.init_args.save_dir={tmp_path}"])  # fmt: skip
    assert exit_info.value.code == 2
    assert "error: model.ignore_index=255 but data.ignore_index=None" in capsys.readouterr().err
    assert not any(tmp_path.rglob("version_*"))  # the run directory it had started is removed


@pytest.mark.parametrize(("shape", "depth"), [((3, 16, 16), 2), ((1, 8, 24), 3), ((3, 32, 20), 2), ((3, 6, 10), 1)])
def test_the_unet_gives_logits_per_pixel_for_any_size_divisible_by_two_to_its_depth(
    shape: tuple[int, int, int], depth: int
) -> None:
    torch.manual_seed(0)
    net = UNet(shape, num_outputs=5, channels=4, depth=depth).train()
    assert not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in net.modules())
    x = torch.rand(3, *shape)
    outputs = net(x)
    assert outputs.shape == (3, 5, *shape[1:])
    # GroupNorm normalises each sample over itself: a sample's outputs do not depend on the rest of its batch
    # (with BatchNorm in training mode they would, by O(0.1)). In float32 a batch of 1 and one of 3 may take
    # different convolution kernels, summing in another order: ~1e-7 relative per sum of O(1) values, over the
    # net's ~10 layers, ~1e-6 (seen: 1.3e-6); 1e-5 leaves room for that and none for a batch dependence.
    torch.testing.assert_close(net(x[:1]), outputs[:1], rtol=1e-5, atol=1e-5)


def test_the_unet_refuses_a_size_it_cannot_halve_depth_times() -> None:
    with pytest.raises(ConfigError, match=re.escape("must be divisible by 4, got 18x16")):
        UNet((3, 18, 16), num_outputs=3, depth=2)


@pytest.fixture(scope="module")
def trained(segmentation_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, CLI]:
    save_dir = tmp_path_factory.mktemp("trained")
    cli = fit(save_dir, f"--data.root={segmentation_folder}", "--trainer.max_epochs=2",
              "--trainer.enable_progress_bar=false", configs=(DIGITS, SEGMENTATION))  # fmt: skip
    return Path(cli.trainer.log_dir), cli


@pytest.mark.slow
def test_predict_writes_one_mask_per_input_at_its_size_the_argmax_of_the_outputs(
    trained: tuple[Path, CLI], segmentation_folder: Path, tmp_path: Path
) -> None:
    run, cli = trained
    folder = tmp_path / "new"
    folder.mkdir()
    for name in ("0000.png", "0001.png"):  # the model's own size, 16x16
        shutil.copy(segmentation_folder / "images" / name, folder / name)
    with Image.open(segmentation_folder / "images" / "0002.png") as image:
        image.resize((24, 20)).save(folder / "wide.png")  # another size: its mask comes back at 24x20
    output = tmp_path / "out" / "predictions.csv"
    main(["predict", "--config", str(run / "config.yaml"), f"--ckpt_path={run / 'checkpoints' / 'best.ckpt'}",
          f"--data.predict_path={folder}", "--trainer.callbacks+=project.engine.CSVPredictionWriter",
          f"--trainer.callbacks.output={output}"])  # fmt: skip
    with open(output) as f:
        rows = list(csv.DictReader(f))
    assert [r["input"] for r in rows] == ["0000.png", "0001.png", "wide.png"]
    # The masks are the argmax of the trained model's outputs on those images, decoded as training decodes them.
    files = sorted(folder.iterdir())
    inputs = torch.stack([decode_image(f, (16, 16), grayscale=False) for f in files])
    with torch.inference_mode():
        predicted = cli.model.eval()(cli.datamodule.normalize(inputs)).argmax(dim=1)
    for row, expected, file in zip(rows, predicted, files, strict=True):
        with Image.open(output.parent / row["mask"]) as written:
            mask = np.asarray(written)
            with Image.open(file) as original:
                assert written.size == original.size
        if mask.shape == (16, 16):
            assert mask.tolist() == expected.tolist()
        else:  # resized back to the input's size by nearest neighbour: the same class values, stretched
            resized = Image.fromarray(expected.numpy().astype(np.uint8)).resize((24, 20), Image.Resampling.NEAREST)
            assert mask.tolist() == np.asarray(resized).tolist()
        fractions = torch.bincount(expected.flatten(), minlength=4) / 256
        assert [float(row[f"fraction_{c}"]) for c in CLASSES] == pytest.approx(fractions.tolist(), abs=1e-6)


@pytest.mark.slow
def test_the_export_outputs_the_class_logits_per_pixel_named_in_model_json(trained: tuple[Path, CLI]) -> None:
    import onnxruntime

    from project.engine.inference.export import export

    run, cli = trained
    metadata = export(run / "checkpoints" / "best.ckpt")
    assert metadata["output"]["shape"] == ["batch", 4, "height", "width"]
    assert metadata["output"]["classes"] == CLASSES
    assert json.loads((run / "checkpoints" / "model.json").read_text())["output"]["name"] == "logits"
    assert all(metadata["parity"][k]["max_rel_diff"] <= 1e-4 for k in ("onnx", "pt2"))
    # From raw images: the exported model's argmax is the trained model's mask.
    inputs, _ = cli.datamodule.split_tensors("test")
    session = onnxruntime.InferenceSession(str(run / "checkpoints" / "model.onnx"), providers=["CPUExecutionProvider"])
    logits = torch.from_numpy(session.run(None, {"inputs": inputs.numpy()})[0])
    with torch.inference_mode():
        expected = cli.model.eval()(cli.datamodule.normalize(inputs))
    assert logits.shape == expected.shape == (len(inputs), 4, 16, 16)
    assert (logits.argmax(dim=1) == expected.argmax(dim=1)).float().mean() > 0.999  # ties aside
