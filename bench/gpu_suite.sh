#!/usr/bin/env bash
# Every GPU figure of docs/benchmarks.md and docs/results.md, in two parts that each fit a 10-minute command:
#
#   bash bench/gpu_suite.sh speed   OUT                      # attention, forward, training-step ratios
#   bash bench/gpu_suite.sh quality OUT DATA [overrides...]  # Multi30k de-en and en-de, 3 minutes each
#
# OUT receives one log per benchmark. DATA is a folder with Multi30k's raw files (docs/data.md; default
# ../shared/data/multi30k, where the project's machines keep it). The quality part starts from a first
# GPU recipe: the CPU recipe's 3+3 layers at the paper's width, d_model 512, with 16k-token batches;
# extra section.field=value arguments override it. Needs torch with CUDA, tokenizers, sacrebleu,
# safetensors, pyyaml and tqdm importable (the GPU machines' image has them all); attnkit itself is
# taken from src/, so nothing is installed.
set -euo pipefail
part=${1:?usage: gpu_suite.sh speed|quality OUT [DATA] [overrides...]}
out=${2:?usage: gpu_suite.sh speed|quality OUT [DATA] [overrides...]}
root=$(cd "$(dirname "$0")/.." && pwd)
data=$(realpath "${3:-$root/../shared/data/multi30k}")
mkdir -p "$out"
out=$(realpath "$out")
cd "$root"
export PYTHONPATH="$root/src" PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "no GPU"; } \
    | tee "$out/gpu.txt"

case $part in
speed)
    python3 bench/attention.py 2>&1 | tee "$out/attention.txt"
    python3 bench/forward.py 2>&1 | tee "$out/forward.txt"
    for preset in small paper-base; do
        python3 bench/train_speed.py --preset $preset --batch 64x64 2>&1 | tee -a "$out/train_speed.txt"
        python3 bench/train_speed.py --preset $preset --batch 64x64 --compile 2>&1 | tee -a "$out/train_speed.txt"
    done
    ;;
quality)
    for direction in de-en en-de; do
        python3 bench/quality_multi30k.py --data "$data" --minutes 3 --direction $direction \
            --run-dir "/tmp/attnkit_quality_$direction" \
            model.d_model=512 model.d_ff=2048 model.h=8 train.max_tokens=16384 train.lr=1e-3 \
            train.warmup=400 train.eval_every=200 "${@:4}" 2>&1 | tee "$out/quality_$direction.txt"
    done
    ;;
*)
    echo "gpu_suite.sh: unknown part '$part'; use speed or quality" >&2
    exit 2
    ;;
esac
