"""A PyTorch Lightning project template: see README.md (and its pages under docs/)."""

import importlib.abc
import importlib.util
import sys
from pathlib import Path


def _cpu_torch_with_a_cuda_torchvision() -> None:
    """torchvision (timm needs it; torchmetrics and so Lightning import it whenever it is installed) is a CUDA build
    on PyPI: beside the CPU torch its C++ ops cannot load, and its import then fails registering a fake kernel
    for ``torchvision::nms``, an operator never defined, which breaks every command. Nothing here uses those ops
    (detection boxes): their schemas alone let the import through. Where the ops load (a torchvision matching
    torch), nothing is done: they define themselves."""
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        return
    import torch

    try:
        for library in sorted(Path(spec.origin).parent.glob("_C.*"))[:1]:
            torch.ops.load_library(str(library))
        return
    except OSError:
        pass
    for op in ("nms", "qnms"):
        if not hasattr(torch.ops.torchvision, op):
            torch.library.define(f"torchvision::{op}", "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


class _BeforeTorchvision(importlib.abc.MetaPathFinder):
    """Runs the check above when something first imports torchvision (torchmetrics does, on importing Lightning),
    not at import of this package: ``make runs`` imports no torch at all."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "torchvision":
            sys.meta_path.remove(self)
            _cpu_torch_with_a_cuda_torchvision()
        return None  # the ordinary finders import it


sys.meta_path.insert(0, _BeforeTorchvision())
