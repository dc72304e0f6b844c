"""FSDP2 (``configs/fsdp.yaml``: ModelParallelStrategy provides the device mesh): each unit of the net sharded, then
the whole net, over the data-parallel dimension, before the optimizer is built."""

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from project.engine.errors import ConfigError


def units_of(net: nn.Module) -> list[nn.Module]:
    """The modules sharded one by one: those the net names (``shard_units``, e.g. a transformer's blocks), else every
    layer with weights. A weight tied across two of them, or between one and the rest of the net (a head tied to an
    embedding), would belong to two FSDP groups, which FSDP refuses at the first forward: refused here in a sentence."""
    named = getattr(net, "shard_units", None)
    units = list(named() if named else (m for m in net.modules() if isinstance(m, nn.Linear | nn.Conv2d)))
    inside = {id(m) for unit in units for m in unit.modules()}
    groups = [{id(p) for p in unit.parameters()} for unit in units]
    groups.append({id(p) for m in net.modules() if id(m) not in inside for p in m.parameters(recurse=False)})
    names = {id(p): name for name, p in net.named_parameters(remove_duplicate=False)}
    owner: dict[int, int] = {}
    for group, ids in enumerate(groups):
        for i in ids:
            if owner.setdefault(i, group) != group:
                raise ConfigError(
                    f"FSDP (configs/fsdp.yaml) cannot shard {type(net).__name__}: its parameter {names[i]} is tied to "
                    "one in another sharded unit. Give the net a method shard_units() returning the modules to shard "
                    "one by one (e.g. its transformer blocks), with tied weights left to the net itself."
                )
    return units


def shard(net: nn.Module, mesh: DeviceMesh, precision: str) -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy()  # FSDP's default: compute in the weights' own dtype
    if precision.startswith("bf16"):
        # The gathered weights compute in bfloat16 (half the all-gather), gradients are reduced in float32 and the
        # shards stay float32 (torchtitan's policy).
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for unit in units_of(net):
        fully_shard(unit, mesh=mesh, mp_policy=policy)
    fully_shard(net, mesh=mesh, mp_policy=policy)
