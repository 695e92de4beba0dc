#!/usr/bin/env bash
# Trains the GPT example and its PyTorch FSDP2 peer from the same initial weights on the same batches and compares
# their losses step by step, in fp32 and in bf16. Needs PyTorch and safetensors in python3 (or in $PYTHON):
#   bench/peer/run.sh [--ranks N] [--steps S] [OPTION VALUE ...: any option with a value both programs take, e.g. --layers 2]
# CPU here (gloo, N processes); the figures of its last run are in docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
python="${PYTHON:-python3}"
ranks=2
steps=50
args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --ranks) ranks="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    *) args+=("$1" "$2"); shift 2 ;;
  esac
done
if ! "${python}" -c 'import torch, safetensors' 2>/dev/null; then
  echo "error: ${python} cannot import torch and safetensors (pip install torch safetensors, or set PYTHON)" >&2
  exit 2
fi
tools/with-deps bazel build //examples/04_gpt_host >/dev/null
work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT
status=0
for precision in fp32 bf16; do
  echo "=== ${precision}: ours on ${ranks} thread ranks, PyTorch FSDP2 on ${ranks} gloo processes, ${steps} steps ==="
  bazel-bin/examples/04_gpt_host/04_gpt_host --ranks "${ranks}" --steps "${steps}" --precision "${precision}" \
    --export-init "${work}/init.safetensors" --losses "${work}/ours.txt" "${args[@]}" | grep -E '^(GPT|trained)'
  "${python}" bench/peer/gpt_fsdp2.py --init "${work}/init.safetensors" --ours "${work}/ours.txt" \
    --world "${ranks}" --steps "${steps}" --precision "${precision}" "${args[@]}" | tail -1 || status=1
done
exit "${status}"
