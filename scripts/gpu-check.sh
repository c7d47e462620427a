#!/usr/bin/env bash
# Builds the CUDA test binaries here and runs them on a GPU machine that has no Rust
# toolchain and no registry (the `device` tool's machines).
#
#   scripts/gpu-check.sh build   # here: release test binaries, stripped, into gpu-bin/
#   scripts/gpu-check.sh run     # there (carry gpu-bin): `ndfuse backends`, the GPU
#                                # tests with NDFUSE_REQUIRE_CUDA=1 and
#                                # NDFUSE_REQUIRE_NVRTC=1, then `ndfuse bench --backend
#                                # cuda`; logs into $OUT when set
#
# With the device tool: `scripts/gpu-check.sh build` here, then
#   run(command="scripts/gpu-check.sh run", carry=["gpu-bin"])
#
# NVRTC on the GPU machine: its CUDA image has NVIDIA's pip packages
# (nvidia-cuda-nvrtc, nvidia-cuda-runtime), possibly of another major version than the
# 12.x this build names first; `run` links whatever libnvrtc.so.* it finds there as
# libnvrtc.so (the first name cudarc tries) and points NDFUSE_CUDA_INCLUDE at the headers.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=gpu-bin

case "${1:-}" in
build)
  rm -rf "$BIN" && mkdir -p "$BIN"
  # The test binaries that touch CUDA, found through cargo's JSON messages.
  cargo test --release --no-run -p ndfuse-tests --test cuda_exec --test cuda_codegen \
    --message-format=json 2>/dev/null \
    | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["executable"])' \
    | while read -r exe; do
        name="$(basename "$exe" | sed 's/-[0-9a-f]*$//')"
        cp "$exe" "$BIN/$name"
      done
  cargo build --release -q --bin ndfuse
  cp target/release/ndfuse "$BIN/ndfuse"
  strip "$BIN"/* 2>/dev/null || true
  # insta looks for snapshots next to the test sources, relative to the workspace.
  ls -la "$BIN"
  du -sh "$BIN"
  ;;
run)
  OUT="${OUT:-/tmp/gpu-check-out}"
  mkdir -p "$OUT" /tmp/ndfuse-nvrtc
  site="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  lib="$(ls "$site"/nvidia/cuda_nvrtc/lib/libnvrtc.so.* "$site"/nvidia/cu*/lib/libnvrtc.so.* 2>/dev/null | grep -v builtins | head -n1 || true)"
  if [ -n "$lib" ]; then
    ln -sf "$lib" /tmp/ndfuse-nvrtc/libnvrtc.so
    export LD_LIBRARY_PATH="/tmp/ndfuse-nvrtc:$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
  # cuBLASLt (nvidia-cublas) for the matrix products it takes, under the first name
  # cudarc tries.
  blas="$(ls "$site"/nvidia/cublas/lib/libcublasLt.so.* "$site"/nvidia/cu*/lib/libcublasLt.so.* 2>/dev/null | head -n1 || true)"
  if [ -n "$blas" ]; then
    ln -sf "$blas" /tmp/ndfuse-nvrtc/libcublasLt.so
    export LD_LIBRARY_PATH="/tmp/ndfuse-nvrtc:$(dirname "$blas"):${LD_LIBRARY_PATH:-}"
  fi
  # cuda_fp16.h's directory, and crt/mma.h's (nvidia-cuda-nvcc) for tensor-core kernels.
  inc="$(ls -d "$site"/nvidia/cuda_runtime/include "$site"/nvidia/cu*/include 2>/dev/null | while read -r d; do [ -f "$d/cuda_fp16.h" ] && echo "$d"; done | head -n1 || true)"
  mma="$(ls -d "$site"/nvidia/cu*/include 2>/dev/null | while read -r d; do [ -f "$d/crt/mma.h" ] && echo "$d"; done | head -n1 || true)"
  [ -n "$mma" ] && [ "$mma" != "$inc" ] && inc="${inc:+$inc:}$mma"
  [ -n "$inc" ] && export NDFUSE_CUDA_INCLUDE="$inc"
  echo "nvrtc: ${lib:-not found}; cuBLASLt: ${blas:-not found}; headers: ${inc:-not found}" | tee "$OUT/env.txt"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee -a "$OUT/env.txt" || true
  export NDFUSE_REQUIRE_CUDA=1 NDFUSE_REQUIRE_NVRTC=1 INSTA_UPDATE=no
  status=0
  "$BIN/ndfuse" backends 2>&1 | tee "$OUT/backends.txt" || status=1
  # Each step under its own time limit (the device machine is lent by the minute): a hang
  # fails that step and the rest still run. GPU_CHECK_TESTS=0 skips the tests,
  # GPU_CHECK_BENCH names the suite's groups to time (none: "").
  if [ "${GPU_CHECK_TESTS:-1}" = 1 ]; then
    for t in cuda_codegen cuda_exec; do
      # cuda_codegen's snapshots are compared by the local run; here only its compiles.
      filter=""
      [ "$t" = cuda_codegen ] && filter="compiles"
      timeout "${GPU_CHECK_TEST_S:-240}" "$BIN/$t" --test-threads=1 $filter 2>&1 | tee "$OUT/$t.txt" || status=1
    done
    # The products again on the emitted GEMMs alone (cuBLASLt takes most of them above).
    echo "== NDFUSE_CUDA_GEMM=emitted" | tee -a "$OUT/cuda_exec.txt"
    NDFUSE_CUDA_GEMM=emitted timeout "${GPU_CHECK_TEST_S:-240}" "$BIN/cuda_exec" --test-threads=1 \
      matrix_products 2>&1 | tee -a "$OUT/cuda_exec.txt" || status=1
  fi
  # A disk-cache hit in a fresh process: the first eval compiles with NVRTC and writes
  # the CUBIN to the cache directory, the next two (new processes) read it back and load
  # it; the report's compile_ms is the whole load (file read and cuModuleLoadData).
  if [ "${GPU_CHECK_DISK:-1}" = 1 ]; then
    kc="$(mktemp -d)"
    for turn in compile hit hit; do
      printf '%s: ' "$turn"
      NDFUSE_KERNEL_CACHE_DIR="$kc" timeout 60 "$BIN/ndfuse" eval --backend cuda \
        --random x=1048576 --report json 'gelu(x) * 2 + 1' 2>&1 || status=1
    done | tee "$OUT/disk-cache.txt"
    rm -rf "$kc"
  fi
  # The issue's figures: kernels timed by CUDA events against the device's own copy
  # bandwidth, measured in the same run. One process per group, so one group's failure
  # or hang costs only its own rows.
  for group in ${GPU_CHECK_BENCH-gelu chain softmax layernorm sum broadcast compile matmul attention}; do
    echo "== ndfuse bench --backend cuda $group" | tee -a "$OUT/bench-cuda.md"
    timeout "${GPU_CHECK_BENCH_S:-120}" "$BIN/ndfuse" bench --backend cuda $group 2>&1 | tee -a "$OUT/bench-cuda.md" || status=1
  done
  # The products on the emitted GEMMs, beside cuBLASLt's above.
  for group in ${GPU_CHECK_BENCH_EMITTED-matmul}; do
    echo "== NDFUSE_CUDA_GEMM=emitted ndfuse bench --backend cuda $group" | tee -a "$OUT/bench-cuda.md"
    NDFUSE_CUDA_GEMM=emitted timeout "${GPU_CHECK_BENCH_S:-120}" "$BIN/ndfuse" bench --backend cuda $group 2>&1 \
      | tee -a "$OUT/bench-cuda.md" || status=1
  done
  # The peers: PyTorch eager and torch.compile on the same rows and the same GPU, in
  # the same command (scripts/gpu_peers.py).
  if [ "${GPU_CHECK_PEERS:-1}" = 1 ]; then
    PYTHONUNBUFFERED=1 timeout "${GPU_CHECK_PEERS_S:-240}" python3 scripts/gpu_peers.py ${GPU_CHECK_PEERS_ARGS:-} \
      --out "$OUT/peers.md" 2>&1 | tail -n 40 || status=1
  fi
  exit $status
  ;;
*)
  echo "usage: scripts/gpu-check.sh build|run" >&2
  exit 2
  ;;
esac
