#!/usr/bin/env bash
# Install OpenBLAS (pthread build) for MLX's CPU path when it is missing. Never fails the build:
# without it mlxcel-py still runs, on the reference BLAS the mlx[cpu] wheel links, and says so.
set -u
[ "$(uname -s)" = "Linux" ] || exit 0
if ldconfig -p 2>/dev/null | grep -q 'libopenblas.so.0'; then exit 0; fi
if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "note: OpenBLAS not found; install libopenblas0-pthread for a much faster CPU path" >&2
    exit 0
fi
if ! bash "$(dirname "$0")/apt_install.sh" libopenblas0-pthread; then
    echo "WARNING: could not install libopenblas0-pthread (above). mlxcel-py will run MLX's CPU matmuls on" \
         "the reference BLAS, several times slower for prefill outside the fused CPU step" \
         "(docs/CPU_FAST_PATH.md); run 'make blas' again once apt is free." >&2
fi
exit 0
