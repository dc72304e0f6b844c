"""``python -m project.engine.export <run dir or checkpoint>`` (``make export RUN=...``): the trained network as
``model.onnx`` (for onnxruntime and other runtimes) and ``model.pt2`` (a ``torch.export`` program, for PyTorch
without this code), next to the checkpoint, with ``model.json`` describing the input and the parity check.

Why ``torch.export`` and not TorchScript: ``torch.jit.script/trace/load`` are deprecated in torch 2.13 (they warn
on every call) in favour of ``torch.export``, which also feeds the ONNX exporter used here.

The exported model takes inputs in the DataModule's raw units (as its ``load_predict_inputs`` decodes them: e.g.
images scaled to [0, 1], or a table's feature values) and applies the run's normalisation itself; its outputs are
what the task's ``output_description`` says (a classifier's logits, a regressor's values in the targets' units),
written into ``model.json`` with the input's shape, dtype and normalisation. Any batch size N works, and for token
sequences (int64 inputs shaped (block_size,)) any length from 1 to the block size.
"""

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from project.engine.errors import ConfigError

# Max |difference| allowed between the exported models' outputs and the trained one's, relative to the outputs'
# scale (their largest magnitude, at least 1): float32 rounds at ~1e-7 relative per op, whatever the units.
TOLERANCE = 1e-4
OPSET = 18


class ParityError(RuntimeError):
    pass


class Normalized(nn.Module):
    """(x - mean) / std per channel (feature), then the net and the task's output head: what the trained model
    sees and outputs, from raw inputs."""

    def __init__(
        self, net: nn.Module, normalization: dict[str, list[float]] | None, ndim: int, head: nn.Module
    ) -> None:
        super().__init__()
        self.net, self.head = net, head
        view = (-1,) + (1,) * (ndim - 1)
        stats = normalization or {"mean": [0.0], "std": [1.0]}
        self.register_buffer("mean", torch.tensor(stats["mean"]).view(view))
        self.register_buffer("std", torch.tensor(stats["std"]).view(view))
        self.identity = normalization is None

    mean: Tensor
    std: Tensor

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.net(x if self.identity else (x - self.mean) / self.std))


def export(checkpoint: str | Path, tolerance: float = TOLERANCE) -> dict[str, Any]:
    """Writes model.onnx, model.pt2 and model.json next to ``checkpoint``; returns the metadata (parity included).
    Raises ``ParityError`` if an exported model disagrees with the checkpoint's on the test inputs it keeps."""
    try:
        import onnxruntime
        import onnxscript  # noqa: F401  (the ONNX exporter needs it)
    except ImportError as err:
        raise ConfigError(
            f"export needs the optional 'export' dependencies ({err.name} is missing): pip install -e '.[export]'"
        ) from None
    from project.engine.datamodule import DataModule
    from project.engine.runs import load_run

    checkpoint = Path(checkpoint)
    model, data = load_run(checkpoint, read_data=False)
    inputs, _ = data.examples()  # the checkpoint's test inputs: the same check on any machine, with or without the data
    head = model.output_head()
    net = Normalized(model.net, data.normalization, len(data.input_shape), head).eval()
    output = model.output_description()
    dynamic: dict[int, Any] = {0: torch.export.Dim("batch")}
    sequences = not data.input_dtype.is_floating_point and len(data.input_shape) == 1
    if sequences:  # token ids: a prompt of any length up to the block
        dynamic[1] = torch.export.Dim("sequence", min=1, max=data.input_shape[0])
    example = (inputs[:2],)

    out = checkpoint.parent
    program = torch.export.export(net, example, dynamic_shapes=(dynamic,))
    torch.export.save(program, out / "model.pt2")
    torch.onnx.export(
        net, example, out / "model.onnx", dynamic_shapes=(dynamic,), input_names=["inputs"],
        output_names=[output["name"]], opset_version=OPSET,
    )  # fmt: skip

    with torch.inference_mode():
        reference = head(model(data.normalize(inputs)))  # the trained model, as Lightning feeds it
    scale = max(1.0, reference.abs().max().item())
    session = onnxruntime.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    loaded = torch.export.load(out / "model.pt2").module()
    parity = {}
    some = min(37, len(inputs))
    lengths = sorted({1, max(1, data.input_shape[0] // 2)}) if sequences else []
    with torch.inference_mode():
        checks = [(inputs, reference), (inputs[:1], reference[:1]), (inputs[:some], reference[:some])]
        checks += [(inputs[:some, :n], head(model(inputs[:some, :n]))) for n in lengths]
    for name, run in {
        "onnx": lambda x: torch.from_numpy(session.run(None, {"inputs": x.numpy()})[0]),
        "pt2": lambda x: loaded(x).detach(),
    }.items():
        # The checkpoint's test inputs, then batches of 1 and 37: the batch dimension is dynamic; token sequences also
        # cut to 1 token and to half the block, each against the trained model on the same inputs.
        diff = max((run(x) - expected).abs().max().item() for x, expected in checks)
        parity[name] = {"max_abs_diff": diff, "max_rel_diff": diff / scale}
        if not diff <= tolerance * scale:
            raise ParityError(
                f"{name}: the exported {output['name']} differ from the checkpoint's by {diff:.3g}, more than "
                f"{tolerance} x their scale {scale:.3g}"
            )

    metadata = {
        "checkpoint": checkpoint.name,
        "files": {"onnx": "model.onnx", "torch_export": "model.pt2"},
        "data": data.hparams.get("_class_path") or f"{type(data).__module__}.{type(data).__qualname__}",
        "input": {
            "name": "inputs", "shape": ["batch", *(["sequence"] if sequences else data.input_shape)],
            "dtype": str(data.input_dtype).removeprefix("torch."),
            **({"max_sequence": data.input_shape[0], "vocabulary": len(data.vocabulary or [])} if sequences else {}),
            "units": "raw, as the DataModule's load_predict_inputs decodes them",
            "normalization": data.normalization,
            **({"normalization_inside": True} if data.normalization is not None else {}),
            **({"features": list(data.input_names)} if data.input_names else {}),  # a table's columns, in order
            # What else the DataModule learned to turn raw files into these inputs (a table's encoding).
            **{name: getattr(data, name) for name in type(data).learned if name not in DataModule.learned},
            **data.input_description(),
        },
        "task": model.hparams.get("_class_path") or f"{type(model).__module__}.{type(model).__qualname__}",
        "output": output,
        "onnx_opset": OPSET,
        "parity": {"inputs": f"the first {len(inputs)} test inputs, batch sizes 1 and {some}"
                   + (f", sequence lengths {lengths} and {data.input_shape[0]}" if sequences else ""),
                   "tolerance": f"{tolerance} x max(1, max |output|) = {tolerance * scale:.3g}", **parity},
        "versions": {"torch": torch.__version__, "onnxruntime": onnxruntime.__version__},
    }  # fmt: skip
    (out / "model.json").write_text(json.dumps(metadata, indent=2))
    return metadata


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m project.engine.export", description=__doc__.splitlines()[0])
    parser.add_argument("target", help="a run directory (its checkpoints/best.ckpt is used) or a checkpoint file")
    parser.add_argument("--tolerance", type=float, default=TOLERANCE,
                        help="max |output difference| allowed, relative to the outputs' scale")  # fmt: skip
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
            print(f"{name}: max |output diff| {check['max_abs_diff']:.2e} ({check['max_rel_diff']:.2e} of the scale)")
    print(f"Wrote {checkpoint.parent}/model.onnx, model.pt2 and model.json")


if __name__ == "__main__":
    main()
