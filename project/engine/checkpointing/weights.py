"""Starting weights from files: a run directory, a Lightning checkpoint, or a plain weights file (``.safetensors``,
``.pth``/``.pt``/``.bin``), every one read without running code (safetensors, or ``torch.load(weights_only=True)``).

Only the tensors whose names and shapes match are copied; everything else keeps its fresh initialisation (a new
head for other classes, a stem for another number of channels), and one line says which.
"""

from dataclasses import dataclass
from pathlib import Path

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn

from project.engine.checkpointing.checkpoint_io import load_checkpoint
from project.engine.errors import ConfigError

WEIGHT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".ckpt")


def resolve_weights_file(path: str | Path, key: str) -> Path:
    """A run directory -> its ``checkpoints/best.ckpt`` (else ``last.ckpt``); a file -> itself."""
    path = Path(path)
    if path.is_dir():
        for name in ("best.ckpt", "last.ckpt"):
            if (path / "checkpoints" / name).is_file():
                return path / "checkpoints" / name
        raise ConfigError(
            f"{key}={str(path)!r}: a folder, but not a run directory (it has no checkpoints/best.ckpt "
            "or checkpoints/last.ckpt)."
        )
    if not path.is_file():
        raise ConfigError(f"{key}={str(path)!r}: no such file or run directory.")
    if path.suffix not in WEIGHT_SUFFIXES:
        raise ConfigError(f"{key}={str(path)!r}: expected a run directory or a file ending in {WEIGHT_SUFFIXES}.")
    return path


def read_weights(path: Path, key: str) -> tuple[dict[str, Tensor], list[str] | None]:
    """The tensors in ``path``, and the target names (classes) it was trained for when it is a run's checkpoint
    (None for a plain weights file), from one read: a Lightning checkpoint's ``state_dict`` with the task's
    ``net.`` prefix removed (so its names are the net's), or a plain file's (timm's and torchvision's files,
    optionally under "state_dict", "model" or "module.")."""
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(path)), None
        except Exception as err:
            raise ConfigError(f"{key}={str(path)!r} is not a readable safetensors file: {err}") from None
    if path.suffix == ".ckpt":
        checkpoint = load_checkpoint(path)
        names = checkpoint.get("hyper_parameters", {}).get("target_names")
        state = {k.removeprefix("net."): v for k, v in checkpoint["state_dict"].items() if k.startswith("net.")}
        return state, list(names) if names else None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise ConfigError(
            f"{key}={str(path)!r} is not a weights file torch can read safely: {str(err).splitlines()[0]}"
        ) from None
    for wrapper in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(wrapper), dict):
            state = state[wrapper]
    if not isinstance(state, dict):
        raise ConfigError(f"{key}={str(path)!r} holds a {type(state).__name__}, not a dict of tensors.")
    return {k.removeprefix("module."): v for k, v in state.items() if isinstance(v, Tensor)}, None


@dataclass
class Loaded:
    """What ``load_matching`` copied: the file, the names loaded, and the module's names left as they were."""

    source: str
    loaded: list[str]
    new: list[str]

    def record(self) -> dict[str, object]:
        """For provenance.json."""
        return {"path": self.source, "tensors_loaded": len(self.loaded), "left_new": self.new}


def load_matching(
    module: nn.Module, state: dict[str, Tensor], source: str, key: str, into: str = "", why_new: str = ""
) -> Loaded:
    """Copy every tensor of ``state`` whose name and shape match one of ``module``'s (parameters and buffers, e.g.
    BatchNorm's running statistics) into it, in place (the optimizer, if built, keeps the same tensors); one line
    says how many were loaded and which were left new. Nothing matching is refused: the file is another net's."""
    own = module.state_dict(keep_vars=True)
    matching = [n for n, t in own.items() if n in state and state[n].shape == t.shape]
    if not matching:
        shaped = [n for n in own if n in state]
        why = (
            f"the names match but not the shapes ({shaped[:3]})"
            if shaped
            else (f"no tensor name matches (the file has e.g. {sorted(state)[:3]}, this net {list(own)[:3]})")
        )
        raise ConfigError(f"{key}={source!r}: nothing in it fits this net, {why}: it holds another architecture.")
    with torch.no_grad():
        for name in matching:
            own[name].copy_(state[name])
    new = [n for n in own if n not in set(matching)]
    where = f" into {into}" if into else ""
    shown = ", ".join(_collapse(new)) if new else "none"
    rank_zero_info(
        f"Loaded {len(matching)} of {len(own)} tensors{where} from {source}; left new "
        f"({why_new or 'absent from it, or shaped differently'}): {shown}."
    )
    return Loaded(source, matching, new)


def _collapse(names: list[str]) -> list[str]:
    """``head.3.weight, head.3.bias`` -> ``head.3.{weight,bias}``: the log line stays one readable line."""
    groups: dict[str, list[str]] = {}
    for name in names:
        prefix, _, leaf = name.rpartition(".")
        groups.setdefault(prefix, []).append(leaf)
    shown = [
        f"{p}.{{{','.join(leaves)}}}" if len(leaves) > 1 else f"{p}.{leaves[0]}".lstrip(".")
        for p, leaves in groups.items()
    ]
    return shown if len(shown) <= 8 else [*shown[:8], f"... ({len(names)} tensors in all)"]
