#!/usr/bin/env bash
# Every CUDA path of servetune in one short run (<= 8 minutes on one GPU), and one table to paste into
# docs/animated-drawings.md beside the published GPU rows: fp16/bf16 variants served on the GPU, round-robin
# placement, GPU memory in describe, the Animated Drawings detector at batch 1/4/8 in fp32 and fp16 (10 clients,
# closed loop, as published), and a short tuning study. See benchmarks/gpu_check.py.
#
#   bash benchmarks/gpu_check.sh                 # on a GPU machine
#   bash benchmarks/gpu_check.sh --rehearse      # on a CPU: runs the same code at toy sizes (checks the script)
#
# Without CUDA (and without --rehearse) it says so and exits 2 before doing anything.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
if [[ " $* " != *" --rehearse "* ]]; then
    if ! python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
        echo "gpu_check: no CUDA device here (torch.cuda.is_available() is False): nothing to check." >&2
        echo "gpu_check: run it on a GPU machine, or with --rehearse to check the script on the CPU." >&2
        exit 2
    fi
    nvidia-smi -L || true
fi
exec timeout 900 python3 benchmarks/gpu_check.py "$@"
