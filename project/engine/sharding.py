"""FSDP2 (``configs/fsdp.yaml``: ModelParallelStrategy provides the device mesh): each unit of the net sharded, then
the whole net, over the data-parallel dimension, before the optimizer is built."""

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh


def shard(net: nn.Module, mesh: DeviceMesh, precision: str) -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy()  # FSDP's default: compute in the weights' own dtype
    if precision.startswith("bf16"):
        # The gathered weights compute in bfloat16 (half the all-gather), gradients are reduced in float32 and the
        # shards stay float32 (torchtitan's policy).
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    # The net may name its units (a transformer's blocks); else every layer with weights is one.
    units = getattr(net, "shard_units", None)
    for layer in units() if units else (m for m in net.modules() if isinstance(m, nn.Linear | nn.Conv2d)):
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(net, mesh=mesh, mp_policy=policy)
