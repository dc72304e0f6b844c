"""The shipped nets (project/nets.py): the ResNet takes any image size, and every net refuses a dropout outside
[0, 1) naming the key."""

from pathlib import Path

import pytest
import torch
from conftest import DIGITS

from project.engine import main
from project.nets import ResNet

pytestmark = [
    pytest.mark.guarantee(
        "the image folder and CSV DataModules keep class names, decode like predict, decode the same in worker "
        "processes, and refuse a bad folder, corrupt image, bad column or row naming it; `ResNet` takes any image "
        "size; a 29-line DataModule of your own trains and predicts"
    ),
]


@pytest.mark.parametrize("shape", [(1, 8, 8), (3, 32, 32), (3, 64, 48), (3, 224, 224)])
def test_resnet_takes_any_image_size_with_the_same_weights(shape: tuple[int, int, int]) -> None:
    net = ResNet(shape, num_outputs=5, width=8)
    small = ResNet((shape[0], 8, 8), num_outputs=5, width=8)
    if max(shape[1:]) <= 64:  # the same layers (global average pooling): weights fit any size
        assert [p.shape for p in net.parameters()] == [p.shape for p in small.parameters()]
    assert net.eval()(torch.rand(2, *shape)).shape == (2, 5)


@pytest.mark.parametrize("net", ["MLP", "ConvNet"])
def test_a_dropout_outside_its_range_is_refused_naming_the_key(
    net: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", DIGITS, f"--model.net=project.nets.{net}", "--model.net.init_args.dropout=1.0",
              f"--trainer.logger.init_args.save_dir={tmp_path}"])  # fmt: skip
    assert exit_info.value.code == 2
    assert "model.net.init_args.dropout=1.0: dropout must lie in [0, 1)" in capsys.readouterr().err
