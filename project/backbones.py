"""Any timm model as the backbone of a net, optionally with pretrained weights (needs the ``timm`` extra:
``pip install -e '.[timm]'``).

A net that has a ``backbone`` submodule (this one, and ``project.nets.ResNet``) declares what fine-tuning
freezes and scales (``model.freeze_backbone``, ``model.backbone_lr_scale``); the rest of it is the head, trained
from scratch. A net with pretrained weights also declares ``input_statistics``, the mean and standard deviation
its pretraining normalised with, which the DataModule uses unless the data config sets its own.
"""

from pathlib import Path
from typing import Any

from torch import Tensor, nn

from project.engine import ConfigError, load_matching, read_weights, resolve_weights_file


def _timm() -> Any:
    try:
        import timm
    except ImportError:
        raise ConfigError(
            "model.net.class_path=project.backbones.TimmNet needs timm, an optional extra: pip install -e '.[timm]'."
        ) from None
    return timm


class TimmNet(nn.Module):
    """A timm model without its classifier (``backbone``: images to pooled features) and a new linear ``head`` for
    ``num_outputs``; ``in_chans`` follows the images' channels."""

    def __init__(
        self,
        input_shape: tuple[int, ...],
        num_outputs: int,
        name: str = "resnet18",
        weights: str | None = None,
        dropout: float = 0.0,
    ) -> None:
        """
        Args:
            input_shape: (channels, height, width), linked from the data.
            num_outputs: linked from the data.
            name: a timm model name, optionally with its pretrained tag (``resnet18.a1_in1k``; ``timm.list_models``).
            weights: None: random initialisation; ``timm``: timm's pretrained weights for ``name``, from the local
                Hugging Face cache only (never downloaded); or a local file (``.safetensors``, ``.pth``, ``.bin``,
                or a ``.ckpt`` of a run of this net). Loaded when a fresh run starts (not on resume, predict or
                export, which read the run's own checkpoint): what matches by name and shape (the classifier is
                left out, a stem for other channels is left new).
            dropout: before the head.
        """
        super().__init__()
        if len(input_shape) != 3:
            raise ConfigError(f"TimmNet needs images shaped (channels, height, width), got input_shape={input_shape}.")
        if not 0.0 <= dropout < 1.0:
            raise ConfigError(f"model.net.init_args.dropout={dropout!r}: dropout must lie in [0, 1).")
        timm = _timm()
        if not timm.is_model(name.partition(".")[0]):
            raise ConfigError(f"model.net.init_args.name={name!r}: not a timm model (see timm.list_models()).")
        self.weights = weights
        # num_classes=0: timm's features, pooled; the head is ours, so the backbone's names stay timm's.
        self.backbone = timm.create_model(name, pretrained=False, num_classes=0, in_chans=input_shape[0])
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(self.backbone.num_features, num_outputs))
        cfg = self.backbone.pretrained_cfg
        self.input_statistics: dict[str, list[float]] | None = None
        if weights is not None and cfg.get("mean") and cfg.get("std"):
            self.input_statistics = {"mean": list(cfg["mean"]), "std": list(cfg["std"])}
        self._name = name

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.backbone(x))

    def load_pretrained(self) -> dict[str, object] | None:
        """Load ``weights`` into the backbone (called by the task when a fresh run starts); what was loaded, for
        the run's provenance record."""
        if self.weights is None:
            return None
        key = "model.net.init_args.weights"
        path = self._cached_file() if self.weights == "timm" else resolve_weights_file(self.weights, key)
        state, _ = read_weights(path, key)
        return load_matching(self.backbone, state, str(path), key, into="the backbone").record()

    def _cached_file(self) -> Path:
        """timm's weights for ``name`` in the local Hugging Face cache; one sentence naming what to fetch if absent."""
        from huggingface_hub import try_to_load_from_cache
        from huggingface_hub.constants import HF_HUB_CACHE

        hub_id = self.backbone.pretrained_cfg.get("hf_hub_id")
        if not hub_id:
            raise ConfigError(
                f"model.net.init_args.weights=timm: timm has no Hugging Face weights for {self._name!r}; "
                "give a local file instead (model.net.init_args.weights=<path>)."
            )
        for filename in ("model.safetensors", "pytorch_model.bin"):
            found = try_to_load_from_cache(hub_id, filename)
            if isinstance(found, str):
                return Path(found)
        raise ConfigError(
            f"model.net.init_args.weights=timm: the weights of {self._name!r} are not in the local Hugging Face cache "
            f"({HF_HUB_CACHE}) and are never downloaded here; fetch https://huggingface.co/{hub_id} on a connected "
            f"machine (python -c \"import timm; timm.create_model('{self._name}', pretrained=True)\") and copy its "
            f"cache over, or save its model.safetensors and set model.net.init_args.weights=<that file>."
        )
