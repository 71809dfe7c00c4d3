"""Checks what scripts/build_cuda12.sh built, without a GPU.

  python scripts/cuda12/check.py BUILD_DIR

For libllar_core.so and the _llar_tools module: the device code each holds
(section .nv_fatbin: one fatbin per .cu file, each with an sm_90 cubin and its
compute_90 PTX; the cubins' ELF headers say sm_90 and the PTX says its ISA
version and target), and that neither needs a shared CUDA runtime (the
runtime is the CUDA 12 wheel's libcudart_static.a). For _build_info.py: CUDA
12 and sm_90. Then it loads both modules (no GPU needed) and asks the core for
the NCCL it was compiled against and the one it loaded. Prints one line per
library and fails on the first thing that is not so.
"""
import importlib.util
import os
import re
import struct
import subprocess
import sys

FATBIN_MAGIC = 0xBA55ED50
EM_CUDA = 190


def fail(msg):
  sys.exit(f"check.py: {msg}")


def sections(data):
  """{name: bytes} of an ELF64 little-endian file."""
  if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
    fail("not an ELF64 little-endian file")
  shoff, = struct.unpack_from("<Q", data, 0x28)
  shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
  heads = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
  names_off = heads[shstrndx][4]
  out = {}
  for name, _type, _flags, _addr, off, size in heads:
    end = data.index(b"\0", names_off + name)
    out[data[names_off + name:end].decode()] = data[off:off + size]
  return out


def fatbin_entries(sec):
  """(kind, arch, payload) of every entry of the fatbins in one .nv_fatbin."""
  p, entries = 0, []
  while p < len(sec):
    if not any(sec[p:p + 16]):  # padding between fatbins
      p += 8
      continue
    magic, _version, head, size = struct.unpack_from("<IHHQ", sec, p)
    if magic != FATBIN_MAGIC:
      fail(f"no fatbin header at offset {p} of .nv_fatbin")
    q, end = p + head, p + head + size
    while q < end:
      kind, _v, ehead, payload = struct.unpack_from("<HHIQ", sec, q)
      compressed, = struct.unpack_from("<I", sec, q + 16)
      arch, = struct.unpack_from("<I", sec, q + 28)
      if compressed:
        fail("a compressed fatbin entry (the CUDA 12 build writes them uncompressed)")
      entries.append((kind, arch, sec[q + ehead:q + ehead + payload]))
      q += ehead + payload
    p = end
  return entries


def check_library(path):
  data = open(path, "rb").read()
  secs = sections(data)
  if ".nv_fatbin" not in secs:
    fail(f"{path}: no .nv_fatbin section (no device code)")
  entries = fatbin_entries(secs[".nv_fatbin"])
  cubins = [p for k, a, p in entries if k == 2]
  ptx = [p for k, a, p in entries if k == 1]
  archs = sorted({a for _, a, _ in entries})
  if not cubins or archs != [90] or len(cubins) != len(ptx):
    fail(f"{path}: fatbin entries {[(k, a) for k, a, _ in entries]}; want sm_90 ELF + PTX pairs")
  kernels = 0
  for cubin in cubins:
    if cubin[:4] != b"\x7fELF":
      fail(f"{path}: a fatbin ELF entry is not an ELF file")
    machine, = struct.unpack_from("<H", cubin, 0x12)
    flags, = struct.unpack_from("<I", cubin, 0x30)
    if machine != EM_CUDA or flags & 0xFF != 90:
      fail(f"{path}: cubin e_machine {machine}, e_flags {flags:#x}: not CUDA sm_90")
    kernels += sum(1 for name in sections(cubin) if name.startswith(".nv.info."))
  versions = set()
  for text in ptx:
    head = text[:4096].decode(errors="replace")
    version = re.search(r"^\.version (\S+)", head, re.M)
    target = re.search(r"^\.target (\S+)", head, re.M)
    if not version or not target or target.group(1) != "sm_90":
      fail(f"{path}: PTX without .version or with target {target and target.group(1)}")
    versions.add(version.group(1))
  # The rank-order sum's arithmetic (reduce.cuh): its canonical-NaN rule
  # survives (build_cuda12.sh builds under CUDAFLAGS=-ffast-math, whose
  # finite-math-only would fold those checks away) and nothing flushes
  # subnormals to zero.
  text = b"".join(ptx).decode(errors="replace")
  if path.endswith("libllar_core.so") and "setp.nan" not in text:
    fail(f"{path}: no setp.nan in the PTX: the canonical-NaN checks were folded away")
  ftz = re.findall(r"\b[a-z]+(?:\.[a-z0-9]+)*\.ftz\b", text)
  if ftz:
    fail(f"{path}: flush-to-zero instructions in the PTX ({sorted(set(ftz))[:5]})")
  needed = subprocess.run(["readelf", "-d", path], capture_output=True, text=True,
                          check=True).stdout
  cudart = re.findall(r"\[(libcudart[^\]]*)\]", needed)
  if cudart:
    fail(f"{path}: needs {cudart}; the CUDA runtime should be linked statically")
  print(f"check.py: {os.path.basename(path)}: {len(cubins)} sm_90 cubins ({kernels} kernels) "
        f"+ PTX {'/'.join(sorted(versions))}, {text.count('setp.nan')} NaN checks, no "
        f"flush-to-zero, static CUDA runtime")


def main(build):
  core = os.path.join(build, "libllar_core.so")
  tools = [f for f in os.listdir(build) if f.startswith("_llar_tools.") and f.endswith(".so")]
  if not os.path.exists(core) or len(tools) != 1:
    fail(f"{build}: libllar_core.so or the _llar_tools module is missing")
  check_library(core)
  check_library(os.path.join(build, tools[0]))

  spec = importlib.util.spec_from_file_location(
      "_build_info", os.path.join(build, "_build_info.py"))
  info = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(info)
  if not info.CUDA_VERSION.startswith("12.") or info.CUDA_ARCHITECTURES != "90":
    fail(f"_build_info.py: CUDA {info.CUDA_VERSION}, architectures {info.CUDA_ARCHITECTURES}")
  print(f"check.py: _build_info.py: CUDA {info.CUDA_VERSION}, {info.CUDA_COMPILER}, "
        f"sm_{info.CUDA_ARCHITECTURES}, NCCL headers {info.NCCL_VERSION_CODE}, "
        f"jaxlib {info.JAXLIB_VERSION}")

  # Load both modules in a child (LD_LIBRARY_PATH: the build directory for the
  # core, the wheel's NCCL): their host code runs without a GPU.
  nccl = importlib.util.find_spec("nvidia.nccl")
  env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join(
      [build, os.path.join(list(nccl.submodule_search_locations)[0], "lib")]))
  code = ("import sys; sys.path.insert(0, sys.argv[1]); import _llar, _llar_tools; "
          "print(_llar.nccl_compiled_version(), _llar.nccl_runtime_version())")
  out = subprocess.run([sys.executable, "-c", code, build], env=env, capture_output=True,
                       text=True)
  if out.returncode != 0:
    fail(f"loading the modules failed:\n{out.stderr}")
  compiled, loaded = out.stdout.split()
  if compiled != str(info.NCCL_VERSION_CODE) or compiled != loaded:
    fail(f"NCCL compiled {compiled}, loaded {loaded}, _build_info {info.NCCL_VERSION_CODE}")
  print(f"check.py: both modules load; NCCL {compiled} compiled against and loaded")


if __name__ == "__main__":
  if len(sys.argv) != 2:
    sys.exit(__doc__)
  main(sys.argv[1])
