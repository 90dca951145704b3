#!/usr/bin/env bash
# Install OpenBLAS (pthread build) for MLX's CPU path when it is missing. Never fails the build:
# without it mlxcel-py still runs, on the reference BLAS the mlx[cpu] wheel links.
set -u
[ "$(uname -s)" = "Linux" ] || exit 0
if ldconfig -p 2>/dev/null | grep -q 'libopenblas.so.0'; then exit 0; fi
if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "note: OpenBLAS not found; install libopenblas0-pthread for a much faster CPU path" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q libopenblas0-pthread >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q libopenblas0-pthread >/dev/null 2>&1; } \
    || echo "note: could not install libopenblas0-pthread; continuing with the reference BLAS" >&2
exit 0
