#!/usr/bin/env bash
# On a CUDA machine, in under 5 minutes: the gpu-marked tests, then a bench of the default workload on the GPU.
# Usage: scripts/gpu_check.sh   (after `make install`)
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())"
.venv/bin/python -m pytest -m gpu -ra -q
.venv/bin/python benchmarks/bench.py --repeats 1 --workloads default heavy
# fp32 vs bf16-mixed, compile off vs on: step time of the template on the GPU (and its data-wait curve in TensorBoard).
for extra in "--trainer.precision=32-true" "--trainer.precision=bf16-mixed" "--trainer.precision=bf16-mixed --model.compile=true"; do
    echo "== $extra"
    # shellcheck disable=SC2086
    .venv/bin/python -m project fit --config configs/default.yaml --config configs/gpu.yaml --trainer.max_epochs=5 \
        --model.compile=false $extra --trainer.logger.init_args.name=gpu-check 2>&1 | grep -E "Test of|epoch 4"
done
