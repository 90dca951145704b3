#!/usr/bin/env bash
# Decode tok/s of `mlxcel-py generate` on the default model, --cpu-weights f32 vs native,
# interleaved (the machine may be shared): bench/bench_cpu_weights.sh [runs] [max tokens] [extra flags...]
set -eu
runs=${1:-3}; tokens=${2:-128}; shift $(( $# > 2 ? 2 : $# )) || true
py=${PYTHON:-python}
lscpu | grep -m1 "Model name"
echo "flags: $(grep -m1 -o -w -e avx2 -e avx512f -e avx512_vnni -e avx_vnni /proc/cpuinfo | sort -u | tr '\n' ' ')"
uptime
for i in $(seq "$runs"); do
  for w in f32 native; do
    rate=$("$py" -m mlxcel_py generate --cpu-weights "$w" --max-tokens "$tokens" "$@" \
      "Write a short story about a lighthouse keeper." 2>&1 >/dev/null | grep "^Generation:")
    echo "run $i $w: $rate"
  done
done
uptime
