"""Starting from trained weights: ``model.init_from`` (an earlier run, a checkpoint or a weights file) and a net's
``backbone`` frozen (``model.freeze_backbone``) or trained at its own LR scale (``model.backbone_lr_scale``).

A net declares its pretrained part by having a submodule ``backbone``; the rest (a head for these targets) trains from
the start. ``Task`` calls these from its hooks.
"""

from typing import Any

from torch import nn

from project.engine.checkpointing.weights import load_matching, read_weights, resolve_weights_file
from project.engine.errors import ConfigError


def check_finetuning(net: nn.Module, freeze_backbone: bool | int, backbone_lr_scale: float) -> None:
    if not (isinstance(freeze_backbone, bool) or freeze_backbone >= 0):
        raise ConfigError(f"model.freeze_backbone={freeze_backbone!r}: true, false, or a number of epochs >= 0.")
    if not backbone_lr_scale > 0:
        raise ConfigError(
            f"model.backbone_lr_scale={backbone_lr_scale!r}: must be > 0 (freeze it instead: "
            "model.freeze_backbone=true)."
        )
    if (freeze_backbone or backbone_lr_scale != 1.0) and not isinstance(getattr(net, "backbone", None), nn.Module):
        raise ConfigError(
            f"model.freeze_backbone={freeze_backbone!r}, model.backbone_lr_scale={backbone_lr_scale!r}: "
            f"{type(net).__name__} declares no backbone: a net to fine-tune names its pretrained part "
            "self.backbone (a submodule) and the rest, trained from the start, anything else."
        )


def backbone_of(net: nn.Module) -> nn.Module:
    backbone = net.backbone  # declared by the net (checked by check_finetuning)
    assert isinstance(backbone, nn.Module)
    return backbone


def finetuned_backbone(task: Any) -> nn.Module | None:
    """The backbone that trains in groups of its own (frozen, or at its own LR scale); None if it trains as the rest."""
    hparams = task.hparams
    finetuned = hparams.get("freeze_backbone", False) or hparams.get("backbone_lr_scale", 1.0) != 1.0
    return backbone_of(task.net) if finetuned else None


def frozen_in(freeze_backbone: bool | int, epoch: int) -> bool:
    """Whether ``model.freeze_backbone`` freezes the backbone during ``epoch`` (0-based)."""
    return freeze_backbone is True or (freeze_backbone is not False and epoch < freeze_backbone)


def keep_batchnorm_frozen(backbone: nn.Module) -> None:
    """A frozen backbone's BatchNorm layers back in eval mode (Lightning puts the model in train mode after each
    validation): their running statistics would otherwise drift with the new data while their weights stay fixed."""
    for module in backbone.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.eval()


def load_initial_weights(net: nn.Module, init_from: str | None, target_names: list[str]) -> dict[str, Any]:
    """A fresh run's starting weights: the net's own pretrained ones (``net.load_pretrained()``, if it has that),
    then ``init_from``'s tensors whose names and shapes match. What was loaded, for provenance.json."""
    loaded_from: dict[str, Any] = {}
    load_pretrained = getattr(net, "load_pretrained", None)
    if callable(load_pretrained) and (pretrained := load_pretrained()):
        loaded_from["pretrained"] = pretrained
    if init_from:
        key = "model.init_from"
        path = resolve_weights_file(init_from, key)
        (state, theirs), why_new = read_weights(path, key), ""
        # A head trained for other classes (even as many) would start out wrong with confidence: where the net
        # declares its backbone, only that is taken from a run of other targets.
        if theirs is not None and theirs != target_names and hasattr(net, "backbone"):
            state = {k: v for k, v in state.items() if k.startswith("backbone.")}
            why_new = f"the earlier run's targets were {theirs[:4]}, not {target_names[:4]}"
        loaded = load_matching(net, state, str(path), key, why_new=why_new)
        loaded_from["init_from"] = loaded.record()
    return loaded_from
