"""Loads the CUDA extension ``jax_llar._llar`` and registers its FFI targets.

Loading is lazy (first CUDA lowering, or ``jax_llar.status()``) and happens
after JAX has started its CUDA backend, because the extension must bind to the
same ``libnccl.so.2`` as JAX's CUDA plugin (MEASURED.md: a second NCCL in the
default library path gets picked up otherwise). Before importing the module we
load, with RTLD_GLOBAL, the libnccl.so.2 that the process already mapped (or
the nvidia-nccl wheel's), and afterwards we check that the runtime NCCL is at
least the version whose device headers the kernels were compiled against.
"""

from __future__ import annotations

import atexit
import ctypes
import importlib
import importlib.util
import os
import sys
import threading
from typing import Any

import jax

from jax_llar import _log

TARGET_ALL_REDUCE = "jax_llar_all_reduce"
TARGET_COPY = "jax_llar_copy"
TARGET_COPY_WIDE = "jax_llar_copy_wide"

_lock = threading.Lock()
_module: Any = None
_reason: str | None = None
_loaded = False


def _mapped_nccl() -> str | None:
  """Path of a libnccl.so.2 already mapped into this process, if any."""
  try:
    with open("/proc/self/maps") as f:
      for line in f:
        path = line.rstrip("\n").split(" ")[-1]
        if os.path.basename(path).startswith("libnccl.so"):
          return path
  except OSError:
    pass
  return None


def _wheel_nccl() -> str | None:
  for pkg in ("nvidia.nccl", "nvidia.nccl.cu13", "nvidia.nccl.cu12"):
    try:
      spec = importlib.util.find_spec(pkg)
    except (ImportError, ValueError):
      spec = None
    if spec is None or not spec.submodule_search_locations:
      continue
    for root in spec.submodule_search_locations:
      path = os.path.join(root, "lib", "libnccl.so.2")
      if os.path.exists(path):
        return path
  return None


def nccl_library_path() -> str | None:
  """The libnccl.so.2 jax_llar binds to: the one mapped, else the wheel's."""
  return _mapped_nccl() or _wheel_nccl()


def _load_locked() -> None:
  global _module, _reason, _loaded
  _loaded = True
  if importlib.util.find_spec("jax_llar._llar") is None:
    _reason = ("the CUDA extension jax_llar._llar is not built (no CUDA "
               "compiler at install time); reinstall with nvcc on PATH")
    return
  try:
    cuda_devices = jax.devices("cuda")
  except RuntimeError as e:
    _reason = f"JAX has no CUDA backend ({e})"
    return
  del cuda_devices
  path = nccl_library_path()
  if path is not None:
    try:
      ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError as e:
      _reason = f"cannot load {path}: {e}"
      return
  try:
    mod = importlib.import_module("jax_llar._llar")
  except ImportError as e:
    _reason = f"cannot import the CUDA extension: {e}"
    return
  runtime, compiled = mod.nccl_runtime_version(), mod.nccl_compiled_version()
  if runtime < compiled or runtime // 100 != compiled // 100:
    # Device code reads NCCL's window and device-communicator structs with the
    # layout of the headers it was compiled against: same major.minor only.
    _reason = (f"the NCCL loaded in this process is {runtime}; the kernels were "
               f"compiled against {compiled} and need the same major.minor, at "
               f"least that patch level ({path})")
    return
  for name, fn in mod.registrations().items():
    jax.ffi.register_ffi_target(name, fn, platform="CUDA")
  _module = mod
  atexit.register(_print_error_reports)


def _print_error_reports() -> None:
  """At exit, says what any timed-out wait was waiting for (the XLA error
  that failed the call cannot carry it)."""
  if _module is None:
    return
  for r in _module.error_reports():
    print(f"jax_llar: a bounded wait timed out after {r['waited_ns'] / 1e6:.0f} ms "
          f"on CUDA device {r['device']}: rank {r['rank']} waited for rank "
          f"{r['peer']}, block {r['block']}, line {r['line']}, epoch {r['epoch']} "
          f"(flag {r['flag_expected']} expected, saw {r['flag_seen']})",
          file=sys.stderr)


def load() -> Any | None:
  """Returns the extension module, or None (see `reason()`); idempotent."""
  with _lock:
    if not _loaded:
      _load_locked()
      if _module is None:
        _log.log_once("extension", f"jax_llar: fast path inactive: {_reason}")
    return _module


def reason() -> str | None:
  """Why the extension is unavailable, or None when it is loaded."""
  return _reason


def built() -> bool:
  """True when the CUDA extension was compiled into this installation."""
  return importlib.util.find_spec("jax_llar._llar") is not None
