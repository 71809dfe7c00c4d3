"""Lays out a CUDA 12 toolkit directory for clang from PyPI's CUDA 12 wheels.

  python scripts/cuda12/assemble.py DEST

run with the Python that has the wheels installed (scripts/build_cuda12.sh
pins them). clang's CUDA driver wants what a CUDA installation has under one
root: include/ (cuda_runtime.h and the rest), nvvm/libdevice/libdevice.10.bc,
bin/ptxas and bin/fatbinary; CMake's Clang CUDA support also wants lib64/
(libcudart_static.a) and reads the toolkit version from bin/nvcc --version.
The wheels hold all of it but nvcc and fatbinary, spread over site-packages/
nvidia/*; DEST gets symlinks into them, and:

  bin/fatbinary  runs fatbinary.py beside this file (NVIDIA's nvFatbin library,
                 from nvidia-nvfatbin-cu12, does fatbinary's work);
  bin/nvcc       NOT nvcc: answers only --version, with the release line of the
                 wheel's ptxas (the toolkit's version), and refuses anything else;
  include/curand_mtgp32_kernel.h  empty: clang's CUDA wrapper includes it, and
                 nothing here uses cuRAND (its wheel is 68 MB for this header).
"""
import importlib.util
import os
import shlex
import sys

WHEELS = {  # package under nvidia/ -> the wheel that installs it
    "cuda_runtime": "nvidia-cuda-runtime-cu12",
    "cuda_nvcc": "nvidia-cuda-nvcc-cu12",
    "cuda_cccl": "nvidia-cuda-cccl-cu12",
    "nvfatbin": "nvidia-nvfatbin-cu12",
}


def package_dir(name):
  spec = importlib.util.find_spec(f"nvidia.{name}")
  if spec is None:
    sys.exit(f"assemble.py: {WHEELS[name]} is not installed in {sys.executable}")
  return list(spec.submodule_search_locations)[0]


def link(src, dst):
  if not os.path.exists(src):
    sys.exit(f"assemble.py: {src} not found (wheel layout changed?)")
  if os.path.lexists(dst):
    sys.exit(f"assemble.py: {dst} would come from two wheels")
  os.symlink(src, dst)


def write(path, text):
  with open(path, "w") as f:
    f.write(text)
  os.chmod(path, 0o755)


def main(dest):
  dest = os.path.abspath(dest)
  if os.path.exists(dest) and os.listdir(dest):
    sys.exit(f"assemble.py: {dest} is not empty")
  pkg = {name: package_dir(name) for name in WHEELS}
  for sub in ("include", "bin", "nvvm", "lib64"):
    os.makedirs(os.path.join(dest, sub))

  for name in ("cuda_runtime", "cuda_nvcc", "cuda_cccl"):
    inc = os.path.join(pkg[name], "include")
    for entry in sorted(os.listdir(inc)):
      if entry not in ("__init__.py", "__pycache__"):
        link(os.path.join(inc, entry), os.path.join(dest, "include", entry))
  write(os.path.join(dest, "include", "curand_mtgp32_kernel.h"),
        "// Empty (scripts/cuda12/assemble.py): clang's CUDA wrapper includes this cuRAND\n"
        "// header; nothing built here uses cuRAND.\n")

  link(os.path.join(pkg["cuda_nvcc"], "bin", "ptxas"), os.path.join(dest, "bin", "ptxas"))
  link(os.path.join(pkg["cuda_nvcc"], "nvvm", "libdevice"),
       os.path.join(dest, "nvvm", "libdevice"))
  lib = os.path.join(pkg["cuda_runtime"], "lib")
  for entry in sorted(os.listdir(lib)):
    if entry not in ("__init__.py", "__pycache__"):
      link(os.path.join(lib, entry), os.path.join(dest, "lib64", entry))
  link(os.path.join(lib, "libcudart.so.12"), os.path.join(dest, "lib64", "libcudart.so"))

  here = os.path.dirname(os.path.abspath(__file__))
  write(os.path.join(dest, "bin", "fatbinary"),
        "#!/bin/sh\n# scripts/cuda12/assemble.py: fatbinary through nvFatbin.\n"
        f"exec {shlex.quote(sys.executable)} {shlex.quote(os.path.join(here, 'fatbinary.py'))} "
        '"$@"\n')
  write(os.path.join(dest, "bin", "nvcc"),
        "#!/bin/sh\n"
        "# scripts/cuda12/assemble.py: NOT nvcc (PyPI's CUDA 12 wheels have none). CMake's\n"
        "# Clang CUDA support reads the toolkit version from `nvcc --version`; this gives\n"
        "# the release line of the wheel's ptxas, and refuses anything else.\n"
        'if [ "$#" -eq 1 ] && [ "$1" = --version ]; then\n'
        '  exec "$(dirname "$0")/ptxas" --version\n'
        "fi\n"
        'echo "this CUDA 12 toolkit (PyPI wheels) has no nvcc; compile with clang" >&2\n'
        "exit 1\n")


if __name__ == "__main__":
  if len(sys.argv) != 2:
    sys.exit(__doc__)
  main(sys.argv[1])
