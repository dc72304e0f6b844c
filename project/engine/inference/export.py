"""``make export RUN=...`` (``python -m project.engine.inference.export <run dir or checkpoint>``): the trained
network as ``model.onnx`` (for onnxruntime and other runtimes) and ``model.pt2`` (a ``torch.export`` program, for
PyTorch without this code), next to the checkpoint, with ``model.json`` describing the input and the parity check.

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
import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from project.engine.data import batches
from project.engine.errors import ConfigError

# Max |difference| allowed between the exported models' outputs and the trained one's, relative to the outputs'
# scale (their largest magnitude, at least 1): float32 rounds at ~1e-7 relative per op, whatever the units.
TOLERANCE = 1e-4
OPSET = 18


class ParityError(RuntimeError):
    pass


class Normalized(nn.Module):
    """(x - mean) / std per channel (feature) of each input, then the task's forward (its net, or what the task
    computes around it) and its output head: what the trained model sees and outputs, from raw inputs. The inputs come
    positionally, one per name of ``names`` (several named inputs, handed over as a dict) or the one tensor (``names``
    None): each its own exported input."""

    def __init__(
        self,
        task: nn.Module,
        normalization: list[dict[str, list[float]] | None],
        ndims: list[int],
        head: nn.Module,
        names: list[str] | None = None,
    ) -> None:
        super().__init__()
        self.task, self.head, self.names = task, head, names
        self.identity = [stats is None for stats in normalization]
        for i, (stats, ndim) in enumerate(zip(normalization, ndims, strict=True)):
            view = (-1,) + (1,) * (ndim - 1)
            stats = stats or {"mean": [0.0], "std": [1.0]}
            self.register_buffer(f"mean_{i}", torch.tensor(stats["mean"]).view(view))
            self.register_buffer(f"std_{i}", torch.tensor(stats["std"]).view(view))

    def forward(self, *inputs: Tensor) -> Tensor:
        xs = [
            x if self.identity[i] else (x - getattr(self, f"mean_{i}")) / getattr(self, f"std_{i}")
            for i, x in enumerate(inputs)
        ]
        return self.head(self.task(dict(zip(self.names, xs, strict=True)) if self.names else xs[0]))


@contextmanager
def _output_into(path: Path, mode: str = "w") -> Iterator[None]:
    """What torch's tracers print or log while exporting (torch._dynamo, torch.export, torch.onnx: a failed trace
    prints its graphs, pages of them) goes to ``path``: the process's output descriptors point there meanwhile."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    try:
        with path.open(mode) as file:
            os.dup2(file.fileno(), 1)
            os.dup2(file.fileno(), 2)
            try:
                yield
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
    finally:
        os.close(saved[0])
        os.close(saved[1])


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
    from project.engine.data.datamodule import DataModule
    from project.engine.inference.load import load_run

    checkpoint = Path(checkpoint)
    model, data = load_run(checkpoint, read_data=False)
    inputs, _ = data.examples()  # the checkpoint's test inputs: the same check on any machine, with or without the data
    head = model.output_head()
    named = data.named_inputs  # several inputs: one exported input each, by name, in the DataModule's order
    names = list(named) if named else ["inputs"]
    stats = data.normalization
    net = Normalized(
        model,
        [(stats or {}).get(n) for n in names] if named else [stats],
        [len(named[n][0]) for n in names] if named else [len(data.input_shape)],
        head,
        names if named else None,
    ).eval()
    output = model.output_description()
    batch = torch.export.Dim("batch")
    dynamic: list[dict[int, Any]] = [{0: batch} for _ in names]
    sequences = not named and not data.input_dtype.is_floating_point and len(data.input_shape) == 1
    if sequences:  # token ids: a prompt of any length up to the block
        dynamic[0][1] = torch.export.Dim("sequence", min=1, max=data.input_shape[0])

    def positional(x: Any) -> tuple[Tensor, ...]:
        return tuple(x[n] for n in names) if named else (x,)

    def fed(x: Any) -> dict[str, Any]:  # onnxruntime's inputs, by name
        return {n: t.numpy() for n, t in zip(names, positional(x), strict=True)}

    example = positional(batches.first(inputs, 2))
    out = checkpoint.parent
    log = out / "export.log"  # torch's tracers' own report, pages long when one fails: kept here, not printed
    try:
        with _output_into(log):
            program = torch.export.export(net, example, dynamic_shapes=(tuple(dynamic),))  # forward(*inputs)
    except Exception as err:  # the task's forward is the user's code: what torch.export refuses, in one paragraph
        first = next((line for line in str(err).splitlines() if line.strip()), type(err).__name__)
        with log.open("a") as file:
            file.write(f"{type(err).__name__}: {err}\n")
        raise ConfigError(
            f"export: torch.export cannot trace {type(model).__name__}'s forward (its net and what the task computes "
            f"around it) for any batch size: {first.strip()} ({type(err).__name__}). Each sample's outputs must not "
            "depend on the batch's size or on Python decisions on tensor values (torch.export's documentation). "
            f"torch's full report: {log}"
        ) from None
    torch.export.save(program, out / "model.pt2")
    with warnings.catch_warnings(), _output_into(log, mode="a"):  # several inputs share the batch dimension
        warnings.filterwarnings("ignore", "The axis name: batch will not be used")  # ONNX says it names it once
        torch.onnx.export(
            net,
            example,
            out / "model.onnx",
            dynamic_shapes=(tuple(dynamic),),
            input_names=names,
            output_names=[output["name"]],
            opset_version=OPSET,
        )

    with torch.inference_mode():
        reference = head(model(data.normalize(inputs)))  # the trained model, as Lightning feeds it
    scale = max(1.0, reference.abs().max().item())
    session = onnxruntime.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    loaded = torch.export.load(out / "model.pt2").module()
    parity = {}
    some = min(37, batches.size(inputs))
    lengths = sorted({1, max(1, data.input_shape[0] // 2)}) if sequences else []
    with torch.inference_mode():
        checks = [(inputs, reference), *((batches.first(inputs, n), reference[:n]) for n in (1, some))]
        checks += [(inputs[:some, :n], head(model(inputs[:some, :n]))) for n in lengths]
    for name, run in {
        "onnx": lambda x: torch.from_numpy(session.run(None, fed(x))[0]),
        "pt2": lambda x: loaded(*positional(x)).detach(),
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

    learned = {name: getattr(data, name) for name in type(data).learned if name not in DataModule.learned}
    units = "raw, as the DataModule's load_predict_inputs decodes them"
    if named:  # one entry per exported input, in the order the model takes them
        described: dict[str, Any] = {
            "inputs": [
                {
                    "name": n,
                    "shape": ["batch", *shape],
                    "dtype": str(dtype).removeprefix("torch."),
                    "units": units,
                    "normalization": (stats or {}).get(n),
                }
                for n, (shape, dtype) in named.items()
            ],
            **learned,
            **data.input_description(),
        }
    else:
        described = {
            "input": {
                "name": "inputs",
                "shape": ["batch", *(["sequence"] if sequences else data.input_shape)],
                "dtype": str(data.input_dtype).removeprefix("torch."),
                **(
                    {"max_sequence": data.input_shape[0], "vocabulary": len(data.vocabulary or [])} if sequences else {}
                ),
                "units": units,
                "normalization": data.normalization,
                **({"normalization_inside": True} if data.normalization is not None else {}),
                **({"features": list(data.input_names)} if data.input_names else {}),  # a table's columns, in order
                # What else the DataModule learned to turn raw files into these inputs (a table's encoding).
                **learned,
                **data.input_description(),
            }
        }
    metadata = {
        "checkpoint": checkpoint.name,
        "files": {"onnx": "model.onnx", "torch_export": "model.pt2"},
        "data": data.hparams.get("_class_path") or f"{type(data).__module__}.{type(data).__qualname__}",
        **described,
        "task": model.hparams.get("_class_path") or f"{type(model).__module__}.{type(model).__qualname__}",
        "output": output,
        "onnx_opset": OPSET,
        "parity": {
            "inputs": f"the first {batches.size(inputs)} test inputs, batch sizes 1 and {some}"
            + (f", sequence lengths {lengths} and {data.input_shape[0]}" if sequences else ""),
            "tolerance": f"{tolerance} x max(1, max |output|) = {tolerance * scale:.3g}",
            **parity,
        },
        "versions": {"torch": torch.__version__, "onnxruntime": onnxruntime.__version__},
    }
    (out / "model.json").write_text(json.dumps(metadata, indent=2))
    return metadata


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m project.engine.inference.export", description=__doc__.splitlines()[0]
    )
    parser.add_argument("target", help="a run directory (its checkpoints/best.ckpt is used) or a checkpoint file")
    parser.add_argument(
        "--tolerance",
        type=float,
        default=TOLERANCE,
        help="max |output difference| allowed, relative to the outputs' scale",
    )
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
