#!/usr/bin/env bash
# On a CUDA machine, in about 10 minutes: the gpu-marked tests; the bench of the default, long and sequence
# workloads in bf16-mixed, then long and sequence in bf16-mixed with a compiled net (the template against its
# hand-written loop, each with its MFU); the template's fits in fp32, bf16-mixed, and bf16-mixed with a compiled net;
# then the GPU report of all of it (benchmarks/gpu_report.py: tables to paste into an issue, and
# <out>/gpu-<time>.json).
# Usage: scripts/gpu_check.sh          (after `make install`)
#        scripts/gpu_check.sh --cpu    every command of it, tiny and on the CPU: `make check-manual` runs this, so a
#                                      renamed flag, workload or config fails a check rather than your first GPU.
# GPU_CHECK_OUT (default benchmarks/results) and GPU_CHECK_LOGS (default logs) say where it writes; PYTHON_BIN which
# interpreter runs it (default .venv/bin/python); GPU_CHECK_CONFIG the run it measures (default configs/default.yaml;
# the tests pin their own, so that a default of yours changes none of them).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON_BIN:-.venv/bin/python}
OUT=${GPU_CHECK_OUT:-benchmarks/results}
LOGS=${GPU_CHECK_LOGS:-logs}
CONFIG=${GPU_CHECK_CONFIG:-configs/default.yaml}
if [ "${1:-}" = "--cpu" ]; then
    bench=(--repeats 1 --epochs 2 --checkpoint-mb 0 --table-rows 0 --finetune-steps 0 --parts --workloads default)  # no decomposition, no SFT: minutes here
    compiled_bench=()  # one bench, bf16 and compiled at once (below): each flag's path runs
    fit=(--trainer.accelerator=cpu --trainer.max_epochs=1 --trainer.limit_train_batches=3 --trainer.limit_val_batches=2
         --trainer.limit_test_batches=2 --data.num_workers=0 --trainer.log_every_n_steps=1)
    compiled=eager  # inductor's C++ build takes minutes on a CPU; the eager backend runs the same compile path
else
    "$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())"
    # The sequence workload is the language model example's: a repository made without it benches the others.
    sequence=$("$PY" -c "import sys; sys.path[:0] = ['scripts']; from shipped_examples import present; print('sequence' * present('language_model'))")
    bench=(--repeats 1 --table-rows 0 --parts floor --workloads default long $sequence)  # floor: Lightning's per-step cost on the GPU
    compiled_bench=(--repeats 1 --table-rows 0 --checkpoint-mb 0 --finetune-steps 0 --parts --workloads long $sequence)
    fit=(--trainer.max_epochs=5)
    compiled=true
fi
"$PY" -m pytest -m gpu -ra -q -p no:cacheprovider
# The template against its hand-written loop in bf16-mixed, then compiled (compile is --model.compile: the loop too).
if [ ${#compiled_bench[@]} -eq 0 ]; then
    "$PY" benchmarks/bench.py "${bench[@]}" --config "$CONFIG" --out "$OUT" \
        --run-args="--trainer.precision=bf16-mixed --model.compile=$compiled"
    benches=1
else
    "$PY" benchmarks/bench.py "${bench[@]}" --config "$CONFIG" --out "$OUT" --run-args="--trainer.precision=bf16-mixed"
    "$PY" benchmarks/bench.py "${compiled_bench[@]}" --config "$CONFIG" --out "$OUT" \
        --run-args="--trainer.precision=bf16-mixed --model.compile=$compiled"
    benches=2
fi
# fp32 vs bf16-mixed, compile off vs on: step time of the template (and its data-wait curve in TensorBoard).
for extra in "--trainer.precision=32-true" "--trainer.precision=bf16-mixed" \
             "--trainer.precision=bf16-mixed --model.compile=$compiled"; do
    echo "== $extra"
    # shellcheck disable=SC2086
    "$PY" -m project fit --config "$CONFIG" --config configs/gpu.yaml "${fit[@]}" --model.compile=false \
        $extra --trainer.logger.init_args.save_dir="$LOGS" --trainer.logger.init_args.name=gpu-check 2>&1 \
        | grep -E "Test of|^epoch [0-9]+:"
done
"$PY" benchmarks/gpu_report.py --logs "$LOGS/gpu-check" --out "$OUT" --last 3 --last-benches "$benches" --command "scripts/gpu_check.sh${1:+ $1}"
