#!/usr/bin/env bash
# The CUDA 12 build (issue 14; CI runs it, .ci/run): compiles the whole
# extension against CUDA 12 into a throwaway directory and checks what it
# built. Nothing of it can run here (no GPU).
#
#   scripts/build_cuda12.sh [DIR]    DIR: where to build (default: a new
#                                    temporary directory, removed at the end;
#                                    KEEP=1 keeps it)
#
# PyPI's CUDA 12 wheels have no nvcc driver (benchmarks/NOTES.md entries 44 and
# 50), so the CUDA compiler is clang, as in JAX's and XLA's own CUDA builds:
# Debian 12's clang-19 (installed with apt-get when missing; CLANG names
# another), with a CUDA 12 toolkit laid out from the wheels that jax[cuda12]
# 0.11.2 installs (scripts/cuda12/assemble.py), NCCL headers and library from
# nvidia-nccl-cu12 (the cuda12 extra's range) and the XLA FFI headers of the
# jaxlib that pyproject.toml builds with. The wheels go into a virtual
# environment inside DIR: nvidia-nccl-cu12 and the development environment's
# nvidia-nccl-cu13 are the same Python package (nvidia.nccl).
#
# Exit status: 0 built and checked; 1 failed; 3 no clang-19 and apt-get could
# not install it (nothing was built).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

CLANG=${CLANG:-clang++-19}
# The CUDA 12 wheels of jax-cuda12-plugin[with-cuda] 0.11.2, and NVIDIA's
# fatbin library (fatbinary's work; scripts/cuda12/fatbinary.py) of that release.
WHEELS=(
  "nvidia-cuda-runtime-cu12==12.9.79"
  "nvidia-cuda-nvcc-cu12==12.9.86"
  "nvidia-cuda-cccl-cu12==12.9.27"
  "nvidia-nvfatbin-cu12==12.9.82"
  "nvidia-nccl-cu12>=2.28.9,<2.29"
  "jaxlib>=0.11.2,<0.12"
  "nanobind>=2.4"
)

if ! command -v "$CLANG" >/dev/null 2>&1; then
  if [ "$CLANG" = clang++-19 ] && command -v apt-get >/dev/null 2>&1; then
    echo "build_cuda12: installing Debian's clang-19"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -qq --no-install-recommends clang-19 >/dev/null) || true
  fi
  if ! command -v "$CLANG" >/dev/null 2>&1; then
    echo "build_cuda12: no $CLANG and it could not be installed" >&2
    exit 3
  fi
fi

if [ $# -ge 1 ]; then
  DIR=$(mkdir -p "$1" && cd "$1" && pwd)
else
  DIR=$(mktemp -d "${TMPDIR:-/tmp}/llar-cuda12.XXXXXX")
  [ -n "${KEEP:-}" ] || trap 'rm -rf "$DIR"' EXIT
fi
rm -rf "$DIR/venv" "$DIR/cuda" "$DIR/build"
# Python >= 3.12 (jaxlib 0.11): PYTHON, else the first of python, python3.12
# (in CI: the venv's).
for c in "${PYTHON:-}" python python3.12 python3; do
  if [ -n "$c" ] && command -v "$c" >/dev/null 2>&1 &&
     "$c" -c 'import sys; sys.exit(sys.version_info[:2] < (3, 12))'; then
    PYTHON=$c; break
  fi
  PYTHON=
done
[ -n "$PYTHON" ] || { echo "build_cuda12: no Python >= 3.12 (set PYTHON)" >&2; exit 1; }
"$PYTHON" -m venv "$DIR/venv"
VPY=$DIR/venv/bin/python
"$VPY" -m pip install -q --disable-pip-version-check "${WHEELS[@]}"
if ! command -v cmake >/dev/null 2>&1; then
  "$VPY" -m pip install -q --disable-pip-version-check "cmake>=3.24"
  export PATH=$DIR/venv/bin:$PATH
fi

"$VPY" scripts/cuda12/assemble.py "$DIR/cuda"

# -DCMAKE_CUDA_COMPILER=clang: ffi/CMakeLists.txt's Clang branch (sm_90, the
# toolkit as --cuda-path, src/clang_cuda_compat.h). Built under
# CUDAFLAGS=-ffast-math unless CUDAFLAGS is set: the branch must undo what an
# environment's fast math does to the sums (check.py looks at the PTX).
export CUDAFLAGS=${CUDAFLAGS:--ffast-math}
if ! cmake -S ffi -B "$DIR/build" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_COMPILER="$(command -v "$CLANG")" -DCUDAToolkit_ROOT="$DIR/cuda" \
    -DPython_EXECUTABLE="$VPY" >"$DIR/configure.log" 2>&1; then
  cat "$DIR/configure.log" >&2
  echo "build_cuda12: CMake configuration failed" >&2
  exit 1
fi
if ! cmake --build "$DIR/build" -j "$(nproc)" >"$DIR/build.log" 2>&1; then
  grep -E "error|Error" "$DIR/build.log" | head -n 40 >&2 || true
  tail -n 20 "$DIR/build.log" >&2
  if [ -n "${KEEP:-}" ] || [ $# -ge 1 ]; then
    echo "build_cuda12: the build failed (log: $DIR/build.log)" >&2
  else
    echo "build_cuda12: the build failed (its log, above, is removed with $DIR; KEEP=1 keeps it)" >&2
  fi
  exit 1
fi
echo "build_cuda12: built with $("$CLANG" --version | head -n 1), CUDA $("$DIR/cuda/bin/ptxas" \
  --version | sed -n 's/.*, V//p') wheels; ptxas spill warnings: \
$(grep -c 'Registers are spilled' "$DIR/build.log" || true) kernels"
"$VPY" "$REPO/scripts/cuda12/check.py" "$DIR/build"
echo "build_cuda12: done in ${SECONDS} s"
