#!/usr/bin/env bash
# Everything the GPUs of this machine can check, in one command.
#
#   recipes/check_gpu.sh              # N = the GPUs nvidia-smi lists
#   recipes/check_gpu.sh --dry-run    # print the commands only (a test runs this on CPU machines)
#   recipes/check_gpu.sh --gpus N     # pretend N GPUs (with --dry-run: see what N would run)
#
# N >= 2: the multi-process tests on NCCL, one process per device (ds_hetero/testing/launch.py reads
#         DS_HETERO_TEST_BACKEND): with N >= 4 the parity suites (engine, disaggregated, tensor
#         parallel, boundary) and the 2-rank ones, with N = 2 or 3 the 2-rank ones; the tests that
#         kill a rank are left out (their bounds are gloo's: NCCL notices a dead peer only at its
#         timeout); then benchmarks/bench_boundary.py on NCCL for the layout pairs that fit on N devices.
# N == 1: the engine on CUDA at world size 1 (vision tp1 dp1 + language tp1 dp1: fp32 parity
#         against the HF model and bf16; recipes/check_one_device.py), the main job for a few
#         steps, and the stage models' step times (check_one_device.py --synchronize).
# Any N: packed rows' per-sample attention against the block-diagonal mask on CUDA (one process).
# TF32 is turned off: the parity bars are fp32's.
set -euo pipefail
cd "$(dirname "$0")/.."

DRY=0
GPUS=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --gpus) GPUS="$2"; shift ;;
    *) echo "usage: $0 [--dry-run] [--gpus N]" >&2; exit 2 ;;
  esac
  shift
done
if [ -z "$GPUS" ]; then
  GPUS=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU" || true)
fi

PY=${PYTHON:-.venv/bin/python}
export PYTHONPATH=$PWD
export NVIDIA_TF32_OVERRIDE=0
unset DS_ACCELERATOR  # DeepSpeed picks CUDA

run() {
  echo "+ $*"
  if [ "$DRY" = 0 ]; then "$@"; fi
}

echo "check_gpu: $GPUS GPU(s)"
if [ "$GPUS" -ge 2 ]; then
  export DS_HETERO_TEST_BACKEND=nccl
  KEEP_ALIVE='not dies_mid_step and not dead_peer'
  TWO_RANK="tests/engine/test_skipped_step.py tests/step/test_step_agreement.py"
  if [ "$GPUS" -ge 4 ]; then
    run "$PY" -m pytest -q -k "$KEEP_ALIVE" tests/engine/test_engine_parity.py tests/engine/test_disaggregated.py \
      tests/parallel/test_tensor_parallel_engine.py tests/parallel/test_boundary_communicator.py tests/engine/test_two_engines.py \
      tests/topology/test_comm.py $TWO_RANK
  else
    run "$PY" -m pytest -q -k "$KEEP_ALIVE" $TWO_RANK
  fi
  run "$PY" -m pytest -q tests/step/test_per_sample_attention.py  # packed rows' per-sample attention on CUDA
  run "$PY" benchmarks/bench_boundary.py --backend nccl --max-world "$GPUS" --iters 20
elif [ "$GPUS" -eq 1 ]; then
  run "$PY" recipes/check_one_device.py --steps 5 --synchronize
  run "$PY" -m pytest -q tests/step/test_per_sample_attention.py  # packed rows' per-sample attention on CUDA
  TMP=/tmp/check_gpu_dry_run
  if [ "$DRY" = 0 ]; then TMP=$(mktemp -d); fi
  CONFIG="$TMP/world_of_one.json"
  run "$PY" -c "import json, sys; c = json.load(open('ds_configs/llava_colocated.json')); \
c['train_batch_size'] = 4; c['hetero_parallel']['stages'] = {'vision': {'dp': 1}, 'language': {'dp': 1}}; \
c['bf16'] = {'enabled': True}; c['zero_optimization'] = {'stage': 1}; json.dump(c, open(sys.argv[1], 'w'))" "$CONFIG"
  run "$PY" -m ds_hetero.cli validate "$CONFIG" --world-size 1 --model tiny-llava
  run "$(dirname "$PY")/deepspeed" --num_gpus 1 recipes/train_llava.py --steps 10 --samples 256 \
    --deepspeed_config "$CONFIG" --summary-json "$TMP/summary.json"
  run cat "$TMP/summary.json"
else
  echo "check_gpu: no GPU found (nvidia-smi lists none); nothing to check" >&2
  exit 1
fi
