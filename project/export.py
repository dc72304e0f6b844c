"""``python -m project.export <run dir or checkpoint>`` (``make export RUN=...``): the trained network as
``model.onnx`` (for onnxruntime and other runtimes) and ``model.pt2`` (a ``torch.export`` program, for PyTorch
without this code), next to the checkpoint, with ``model.json`` describing the input and the parity check.

Why ``torch.export`` and not TorchScript: ``torch.jit.script/trace/load`` are deprecated in torch 2.13 (they warn
on every call) in favour of ``torch.export``, which also feeds the ONNX exporter used here.

The input is not normalised inside the model: feed float32 images shaped (N, 1, 8, 8) with values in [0, 1]
(0 = background, 1 = full ink), as ``project/predict.py`` prepares them. Any batch size N works.
"""

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from project.errors import ConfigError

TOLERANCE = 1e-4  # max |logit difference| allowed between the exported models and the trained one
OPSET = 18


class ParityError(RuntimeError):
    pass


def export(checkpoint: str | Path, tolerance: float = TOLERANCE) -> dict[str, Any]:
    """Writes model.onnx, model.pt2 and model.json next to ``checkpoint``; returns the metadata (parity included).
    Raises ``ParityError`` if an exported model disagrees with the checkpoint's on the test split."""
    try:
        import onnxruntime
        import onnxscript  # noqa: F401  (the ONNX exporter needs it)
    except ImportError as err:
        raise ConfigError(
            f"export needs the optional 'export' dependencies ({err.name} is missing): pip install -e '.[export]'"
        ) from None
    from project.checkpoints import load_checkpoint
    from project.data import DigitsDataModule
    from project.module import Classifier

    checkpoint = Path(checkpoint)
    load_checkpoint(checkpoint)  # one clear sentence if it is missing, truncated or unsafe
    model = Classifier.load_from_checkpoint(checkpoint, weights_only=True, map_location="cpu").eval()
    data = DigitsDataModule.load_from_checkpoint(checkpoint, weights_only=True)
    data.setup("test")
    assert data.test_set is not None
    images = data.test_set.images
    net = model.net
    batch = torch.export.Dim("batch")
    example = (images[:2],)

    out = checkpoint.parent
    program = torch.export.export(net, example, dynamic_shapes=({0: batch},))
    torch.export.save(program, out / "model.pt2")
    torch.onnx.export(
        net, example, out / "model.onnx", dynamic_shapes=({0: batch},), input_names=["images"],
        output_names=["logits"], opset_version=OPSET,
    )  # fmt: skip

    with torch.inference_mode():
        reference = net(images)
    session = onnxruntime.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    loaded = torch.export.load(out / "model.pt2").module()
    parity = {}
    for name, run in {
        "onnx": lambda x: torch.from_numpy(session.run(None, {"images": x.numpy()})[0]),
        "pt2": lambda x: loaded(x).detach(),
    }.items():
        # The whole test split, then batches of 1 and 37: the batch dimension is dynamic.
        logits = run(images)
        diff = max(
            (logits - reference).abs().max().item(),
            (run(images[:1]) - reference[:1]).abs().max().item(),
            (run(images[:37]) - reference[:37]).abs().max().item(),
        )
        agreement = (logits.argmax(-1) == reference.argmax(-1)).float().mean().item()
        parity[name] = {"max_abs_logit_diff": diff, "argmax_agreement": agreement}
        if not diff <= tolerance:
            raise ParityError(f"{name}: exported logits differ from the checkpoint's by {diff:.3g} > {tolerance}")

    metadata = {
        "checkpoint": checkpoint.name,
        "files": {"onnx": "model.onnx", "torch_export": "model.pt2"},
        "input": {
            "name": "images", "shape": ["batch", *images.shape[1:]], "dtype": "float32",
            "range": [0.0, 1.0], "meaning": "ink intensity of an 8x8 digit, 0 = background (not normalised inside)",
        },
        "output": {"name": "logits", "shape": ["batch", data.num_classes], "classes": list(range(data.num_classes))},
        "onnx_opset": OPSET,
        "parity": {"inputs": f"test split ({len(images)} images), batch sizes 1 and 37", "tolerance": tolerance,
                   **parity},
        "versions": {"torch": torch.__version__, "onnxruntime": onnxruntime.__version__},
    }  # fmt: skip
    (out / "model.json").write_text(json.dumps(metadata, indent=2))
    return metadata


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m project.export", description=__doc__.splitlines()[0])
    parser.add_argument("target", help="a run directory (its checkpoints/best.ckpt is used) or a checkpoint file")
    parser.add_argument("--tolerance", type=float, default=TOLERANCE, help="max |logit difference| allowed")
    args = parser.parse_args(argv)
    target = Path(args.target)
    checkpoint = target / "checkpoints" / "best.ckpt" if target.is_dir() else target
    try:
        metadata = export(checkpoint, args.tolerance)
    except (ConfigError, ParityError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    for name, check in metadata["parity"].items():
        if isinstance(check, dict):
            diff, agreement = check["max_abs_logit_diff"], check["argmax_agreement"]
            print(f"{name}: max |logit diff| {diff:.2e}, argmax agreement {agreement:.2%}")
    print(f"Wrote {checkpoint.parent}/model.onnx, model.pt2 and model.json")


if __name__ == "__main__":
    main()
