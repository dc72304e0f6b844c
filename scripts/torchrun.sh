#!/usr/bin/env bash
# Multi-GPU / multi-node training with torchrun; Lightning reads the torchrun environment (no second launch).
#
# One machine, all its GPUs:
#   scripts/torchrun.sh --config configs/default.yaml
# N machines: run on every node, the same line, with NNODES, NODE_RANK (0..NNODES-1) and MASTER_ADDR (node 0):
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 scripts/torchrun.sh --config configs/default.yaml
#   NNODES=2 NODE_RANK=1 MASTER_ADDR=10.0.0.1 scripts/torchrun.sh --config configs/default.yaml
# Extra arguments go to `python -m project fit`, before the DDP flags, so that a --config among them cannot reset
# the strategy, node count or devices (a config's later keys win). data.batch_size stays per process.
set -euo pipefail
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
NPROC_PER_NODE=${NPROC_PER_NODE:-$(python -c "import torch; print(max(torch.cuda.device_count(), 1))")}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
MASTER_PORT=${MASTER_PORT:-29500}
# A static rendezvous (node ranks given, a fixed node count): a c10d agent polls node 0's rendezvous store for
# joining nodes while its workers run, so an agent whose ranks finish after node 0's has exited fails with
# RendezvousConnectionError, exit 1 after a finished run (torchtune #2676; seen here under load).
exec torchrun --nnodes "$NNODES" --nproc-per-node "$NPROC_PER_NODE" --node-rank "$NODE_RANK" \
    --rdzv-backend static --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \
    -m project fit "$@" --trainer.strategy=ddp --trainer.num_nodes="$NNODES" --trainer.devices="$NPROC_PER_NODE"
