#!/usr/bin/env bash
# Builds NCCL 2.30 or later (the first that lets several ranks share one GPU, NCCL_MULTI_RANK_GPU_ENABLE) for this
# machine's GPU architecture into build/nccl/, where a2a/sharing.py looks for it (docs/sharing.md, "World size 8 on fewer
# GPUs"). A user with a package registry can instead `pip install 'nvidia-nccl-cu13>=2.30'` next to torch.
#
#   tools/build_nccl.sh                    clone NVIDIA/nccl at NCCL_REF (default v2.30.7-1) and build it
#   NCCL_SRC=DIR|FILE.tar.gz tools/build_nccl.sh   build a checkout or a source archive (machines with no network)
#
# NCCL_ARCH (e.g. 90) overrides the architecture read from nvidia-smi; CUDA_HOME the toolkit next to nvcc.
set -euo pipefail
cd "$(dirname "$0")/.."
ref=${NCCL_REF:-v2.30.7-1}
src=${NCCL_SRC:-build/nccl-src}
if [ -f "$src" ]; then  # an archive: unpack it once
  mkdir -p build/nccl-src
  tar -xzf "$src" -C build/nccl-src
  src=build/nccl-src
elif [ ! -f "$src/makefiles/version.mk" ]; then
  git clone --quiet --depth 1 --branch "$ref" https://github.com/NVIDIA/nccl "$src"
fi
nvcc=$(command -v nvcc) || { echo "build_nccl: nvcc is not on the PATH" >&2; exit 113; }
cuda_home=${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$nvcc")")")}
[ -f "$cuda_home/include/cuda_runtime.h" ] || cuda_home=/usr/local/cuda  # nvcc linked from /usr/local/bin
arch=${NCCL_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '. ')}
[ -n "$arch" ] || { echo "build_nccl: no GPU to read the architecture from; set NCCL_ARCH (e.g. 90)" >&2; exit 113; }
started=$(date +%s)
make -C "$src" -j"$(nproc)" src.build BUILDDIR="$PWD/build/nccl" CUDA_HOME="$cuda_home" \
  NVCC_GENCODE="-gencode=arch=compute_$arch,code=sm_$arch" > build/nccl-build.log 2>&1 \
  || { tail -n 20 build/nccl-build.log >&2; echo "build_nccl: the build failed (build/nccl-build.log)" >&2; exit 1; }
echo "built $(readlink -f build/nccl/lib/libnccl.so.2) for sm_$arch in $(( $(date +%s) - started )) s"
