#!/usr/bin/env bash
# Build llama-server, llama-embedding, llama-quantize and llama-mtmd-cli from the llama.cpp source inside the llama-cpp-python sdist (PyPI),
# outside any git worktree, for the side-by-side benchmark and the embedding fixture. Idempotent: each step
# is skipped when its output exists. Usage: scripts/build_llama_server.sh [DIR]  (default $LLAMA_BUILD_DIR, else ~/.cache/mlxcel-py/llama-build);
# then LLAMA_SERVER=DIR/bin/llama-server for the benchmarks
set -euo pipefail
DIR="${1:-${LLAMA_BUILD_DIR:-$HOME/.cache/mlxcel-py/llama-build}}"
PYTHON="${PYTHON:-$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python}"
JOBS="${JOBS:-2}"
mkdir -p "$DIR" "$DIR/bin"
cd "$DIR"

# Only the sdist is wanted: its build dependencies may come as wheels (":all:" would build them from source).
if ! ls llama_cpp_python-*.tar.gz >/dev/null 2>&1; then
    "$PYTHON" -m pip download --no-binary llama-cpp-python --no-deps llama-cpp-python -d "$DIR"
fi
SDIST="$(ls llama_cpp_python-*.tar.gz | sort -V | tail -n 1)"
SRC="$DIR/${SDIST%.tar.gz}"
[ -d "$SRC" ] || tar -xzf "$SDIST"
LLAMA="$SRC/vendor/llama.cpp"
[ -f "$LLAMA/CMakeLists.txt" ] || { echo "error: no llama.cpp source in $SRC/vendor" >&2; exit 1; }

cd "$LLAMA"
# Static libraries, so the installed binaries stand alone in $DIR/bin.
[ -f build/CMakeCache.txt ] || cmake -B build -DLLAMA_CURL=OFF -DGGML_NATIVE=ON -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF
nice -n 15 cmake --build build -j"$JOBS" --target llama-server llama-embedding llama-quantize llama-mtmd-cli

cp -a build/bin/llama-server build/bin/llama-embedding build/bin/llama-quantize build/bin/llama-mtmd-cli "$DIR/bin/"
echo "llama.cpp $(basename "$SRC") -> $DIR/bin: $(ls "$DIR/bin" | tr '\n' ' ')"
