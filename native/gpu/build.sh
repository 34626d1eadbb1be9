#!/bin/sh
# Optional GPU build: a real NCCL allreduce program to run with the plugin loaded.
# Needs nvcc (CUDA_HOME/bin, /usr/local/cuda/bin, /usr/local/bin or PATH), NCCL
# headers and libnccl.so.2 (NCCL_HOME, or the PyPI package nvidia-nccl-cu13 in
# ../.venv or any python on PATH), and mpicc. Missing pieces: say which, exit 0.
BUILD=${1:-build}
HERE=$(cd "$(dirname "$0")/.." && pwd)
skip() { echo "gpu: skipped: $*"; exit 0; }
NVCC=""
for c in "${CUDA_HOME:+$CUDA_HOME/bin/nvcc}" /usr/local/cuda/bin/nvcc /usr/local/bin/nvcc "$(command -v nvcc)"; do
  [ -n "$c" ] && [ -x "$c" ] && { NVCC=$c; break; }
done
[ -n "$NVCC" ] || skip "no nvcc (set CUDA_HOME)"
NCCL_INC=""; NCCL_LIB=""
if [ -n "${NCCL_HOME:-}" ] && [ -f "$NCCL_HOME/include/nccl.h" ]; then
  NCCL_INC=$NCCL_HOME/include; NCCL_LIB=$NCCL_HOME/lib
else
  for py in "$HERE/../.venv/bin/python" python3; do
    d=$("$py" -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null) || continue
    [ -f "$d/include/nccl.h" ] && { NCCL_INC=$d/include; NCCL_LIB=$d/lib; break; }
  done
fi
[ -n "$NCCL_INC" ] || skip "no NCCL headers (pip install nvidia-nccl-cu13, or set NCCL_HOME)"
command -v mpicc >/dev/null || skip "no mpicc"
mkdir -p "$BUILD"
OUT=$BUILD/nccl_plugin_allreduce
echo "gpu: $NVCC, NCCL headers in $NCCL_INC"
set -x
"$NVCC" -O2 -std=c++17 -I"$NCCL_INC" $(mpicc --showme:compile) -o "$OUT" "$HERE/gpu/nccl_plugin_allreduce.cu" \
  -L"$NCCL_LIB" -l:libnccl.so.2 -Xlinker -rpath -Xlinker "$NCCL_LIB" $(mpicc --showme:link)
