"""`fatbinary` for clang's CUDA driver, through NVIDIA's nvFatbin library.

PyPI's CUDA 12 wheels have no `fatbinary` program; nvidia-nvfatbin-cu12 has
the library that does its work (nvFatbin, CUDA 12.4 and newer). clang 19 runs

  fatbinary -64 --create OUT [-g] --image=profile=sm_XX,file=CUBIN
                                  --image=profile=compute_XX,file=PTX

once per .cu file; this makes OUT from the same images with nvFatbin, uncompressed
(so that check.py can read the cubins in the built library). Anything else it
refuses, naming the argument. Run by the bin/fatbinary that assemble.py writes.
"""
import ctypes
import importlib.util
import os
import sys


def main(argv):
  out, images, options = None, [], []
  args = iter(argv)
  for a in args:
    if a == "--create":
      out = next(args)
    elif a.startswith("--image="):
      fields = dict(kv.split("=", 1) for kv in a[len("--image="):].split(","))
      images.append((fields["profile"], fields["file"]))
    elif a in ("-64", "-g", "--cuda", "-cuda"):
      options.append("-" + a.lstrip("-"))
    else:
      sys.exit(f"fatbinary (nvFatbin): unsupported argument {a!r}")
  if out is None or not images:
    sys.exit("fatbinary (nvFatbin): need --create OUT and at least one --image")
  options.append("-compress=false")

  spec = importlib.util.find_spec("nvidia.nvfatbin")
  if spec is None:
    sys.exit("fatbinary (nvFatbin): nvidia-nvfatbin-cu12 is not installed in this Python")
  lib = ctypes.CDLL(os.path.join(list(spec.submodule_search_locations)[0], "lib",
                                 "libnvfatbin.so.12"))
  lib.nvFatbinGetErrorString.restype = ctypes.c_char_p

  def check(rc, what):
    if rc != 0:
      sys.exit(f"fatbinary (nvFatbin): {what}: {lib.nvFatbinGetErrorString(rc).decode()}")

  handle = ctypes.c_void_p()
  opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
  check(lib.nvFatbinCreate(ctypes.byref(handle), opts, ctypes.c_size_t(len(options))),
        f"create {options}")
  for profile, path in images:
    kind, _, arch = profile.partition("_")
    with open(path, "rb") as f:
      data = f.read()
    name = os.path.basename(path).encode()
    if kind == "sm":
      check(lib.nvFatbinAddCubin(handle, data, ctypes.c_size_t(len(data)), arch.encode(), name),
            path)
    elif kind == "compute":
      data += b"\0"
      check(lib.nvFatbinAddPTX(handle, data, ctypes.c_size_t(len(data)), arch.encode(), name,
                               b""), path)
    else:
      sys.exit(f"fatbinary (nvFatbin): unsupported profile {profile!r}")
  size = ctypes.c_size_t()
  check(lib.nvFatbinSize(handle, ctypes.byref(size)), "size")
  buf = ctypes.create_string_buffer(size.value)
  check(lib.nvFatbinGet(handle, buf), "get")
  lib.nvFatbinDestroy(ctypes.byref(handle))
  with open(out, "wb") as f:
    f.write(buf.raw)


if __name__ == "__main__":
  main(sys.argv[1:])
