"""Loads the CUDA extension ``jax_llar._llar`` and registers its FFI targets.

Loading is lazy (first CUDA lowering, or ``jax_llar.status()``) and happens
after JAX has started its CUDA backend, because the extension must bind to the
same ``libnccl.so.2`` as JAX's CUDA plugin (a second NCCL in the default
library path gets picked up otherwise). Before importing the module we load,
with RTLD_GLOBAL, the libnccl.so.2 that the process already mapped (or the
nvidia-nccl wheel's), and afterwards we check:
  - that the running jaxlib's XLA FFI API has the major version of the
    headers the handlers were compiled against, at the same or a later minor
    version (``_build_info.XLA_FFI_API_VERSION``; a build without that record
    is not checked);
  - that the runtime NCCL has the major.minor of the headers the kernels were
    compiled against, at the same or a later patch level (the device code
    reads NCCL's window and device-communicator structs with that layout);
  - that the extension's algorithm ids and limits (``ALGORITHMS``,
    ``MAX_BYTES``, ``MAX_RANKS``), the signed algorithms (``SIGNED``) and
    the signature's width (``SIGNATURE_BITS``) equal ``jax_llar.algorithms``'
    and ``jax_llar.signature``'s.
Any failure leaves the fast path inactive, with the reason in `reason()`.
A working extension with a (jax, NCCL) pair that was never tested on GPUs is
used, and a warning says so once.

The build writes ``jax_llar/_build_info.py`` (CMake: ``NCCL_VERSION_CODE``,
``CUDA_VERSION``, ``CUDA_ARCHITECTURES``, ``JAXLIB_VERSION``, ``XLA_FFI_API_VERSION``) next
to the extension; a source
tree without a CUDA build has neither.
"""

from __future__ import annotations

import atexit
import ctypes
import hashlib
import importlib
import importlib.util
import os
import re
import sys
import threading
from typing import Any

import jax

from jax_llar import algorithms, log, signature
from jax_llar.reports import decode_report

TARGET_ALL_REDUCE = "jax_llar_all_reduce"

# (jax version, NCCL runtime version code) pairs the GPU suite and the
# benchmarks ran with. NCCL codes are NCCL_VERSION_CODE values,
# major * 10000 + minor * 100 + patch.
TESTED_VERSIONS = frozenset({("0.11.2", 22809)})

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
  ffi_mismatch = ffi_api_mismatch(built_ffi_api_version(), runtime_ffi_api_version())
  if ffi_mismatch is not None:
    _reason = ffi_mismatch
    return
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
    _reason = (f"the NCCL loaded in this process is {nccl_version_string(runtime)}; "
               f"the kernels were compiled against {nccl_version_string(compiled)} "
               f"and need the same major.minor, at least that patch level ({path})")
    return
  mismatch = constants_mismatch(mod)
  if mismatch is not None:
    _reason = mismatch
    return
  for name, fn in mod.registrations().items():
    jax.ffi.register_ffi_target(name, fn, platform="CUDA")
  _module = mod
  atexit.register(_print_error_reports)


def runtime_ffi_api_version() -> tuple[int, int] | None:
  """(major, minor) of the XLA FFI API of the jaxlib in this process, read
  from its headers (``jax.ffi.include_dir()``, ``XLA_FFI_API_MAJOR/MINOR`` in
  ``xla/ffi/api/c_api.h``), or None when they cannot be read."""
  try:
    path = os.path.join(jax.ffi.include_dir(), "xla", "ffi", "api", "c_api.h")
    with open(path, encoding="utf-8", errors="replace") as f:
      text = f.read()
  except (OSError, AttributeError):
    return None
  return _parse_ffi_api_version(text)


def _parse_ffi_api_version(text: str) -> tuple[int, int] | None:
  found = dict(re.findall(r"^#define XLA_FFI_API_(MAJOR|MINOR)\s+(\d+)\s*$", text,
                          re.MULTILINE))
  if set(found) != {"MAJOR", "MINOR"}:
    return None
  return int(found["MAJOR"]), int(found["MINOR"])


def built_ffi_api_version() -> tuple[int, int] | None:
  """(major, minor) of the XLA FFI API the handlers were compiled against
  (``_build_info.XLA_FFI_API_VERSION``), or None from a build without it."""
  try:
    info = importlib.import_module("jax_llar._build_info")
    major, minor = info.XLA_FFI_API_VERSION
    return int(major), int(minor)
  except Exception:  # pylint: disable=broad-exception-caught
    return None


def ffi_api_mismatch(built_version: tuple[int, int] | None,
                     runtime_version: tuple[int, int] | None) -> str | None:
  """Why handlers compiled against XLA FFI API `built_version` cannot run with
  jaxlib's `runtime_version`, or None when they can (or either is unknown).

  XLA's runtime keeps supporting handlers built against older minor versions
  of its API, and a major version change breaks the ABI (xla/ffi/api/c_api.h,
  "Version"): the runtime needs the same major version and at least the minor
  version of the headers the handlers were built with.
  """
  if built_version is None or runtime_version is None:
    return None
  if (runtime_version[0] == built_version[0]
      and runtime_version[1] >= built_version[1]):
    return None
  b, r = ("%d.%d" % built_version), ("%d.%d" % runtime_version)
  return (f"the handlers were compiled against XLA FFI API {b} and this jaxlib "
          f"({getattr(jax, '__version__', '?')}) has XLA FFI API {r}: rebuild "
          f"jax_llar against this jaxlib (pip install --no-build-isolation "
          f"--force-reinstall --no-deps .) or install the jaxlib it was built "
          f"with")


def constants_mismatch(mod: Any) -> str | None:
  """Why the extension module `mod` disagrees with ``jax_llar.algorithms``
  (its ``ALGORITHMS``, ``MAX_BYTES``, ``MAX_RANKS`` or the fused kernel's
  ``FUSED_*`` grid constants), or None when the
  ids and limits agree. Python picks the algorithm id and size class that
  the kernels then trust, so a disagreement must keep the fast path off."""
  want = {
      "ALGORITHMS": {a.short_name: int(a) for a in algorithms.Algorithm},
      "MAX_BYTES": {a.short_name: n for a, n in algorithms.MAX_BYTES.items()},
      "MAX_RANKS": algorithms.MAX_RANKS,
      "FUSED_MAX_BYTES": algorithms.FUSED_MAX_BYTES,
      "FUSED_BLOCK_LINES": algorithms.FUSED_BLOCK_LINES,
      "FUSED_MAX_CLUSTER_BLOCKS": algorithms.FUSED_MAX_CLUSTER_BLOCKS,
      "SIGNED": sorted(a.short_name for a in algorithms.SIGNED),
      "SIGNATURE_BITS": signature.SIGNATURE_BITS,
  }
  for name, value in want.items():
    got = getattr(mod, name, None)
    if got is None:
      return (f"the CUDA extension does not export {name}: it was built from "
              "other sources than this Python package; reinstall jax_llar")
    if isinstance(value, dict):
      got = dict(got)
    elif isinstance(value, list):
      got = sorted(got)
    if got != value:
      return (f"the CUDA extension's {name} is {got!r}, jax_llar.algorithms "
              f"says {value!r}: the extension was built from other sources "
              "than this Python package; reinstall jax_llar")
  return None


def nccl_version_string(code: int) -> str:
  """``"2.28.9"`` for the NCCL_VERSION_CODE 22809 (NCCL >= 2.9 encoding)."""
  return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"


def untested_versions_message(jax_version: str, nccl_code: int) -> str | None:
  """The warning for a (jax, NCCL runtime) pair outside TESTED_VERSIONS, or
  None for a tested pair."""
  if (jax_version, nccl_code) in TESTED_VERSIONS:
    return None
  tested = "; ".join(f"jax {j} with NCCL {nccl_version_string(n)}"
                     for j, n in sorted(TESTED_VERSIONS))
  return (f"jax_llar: the fast path runs with jax {jax_version} and NCCL "
          f"{nccl_version_string(nccl_code)}, a pair not tested on GPUs "
          f"(tested: {tested}). Run the GPU suite (tests/gpu) to check it.")


def _warn_if_untested(mod: Any) -> None:
  message = untested_versions_message(jax.__version__,
                                      int(mod.nccl_runtime_version()))
  if message is not None:
    log.log_once("untested_versions", message)


def _print_error_reports() -> None:
  """At exit, says what any failed wait was waiting for (the XLA error that
  failed the call cannot carry it): a timeout, or a mispaired call's foreign
  signature (``jax_llar.reports.report_message``)."""
  if _module is None:
    return
  for r in _module.error_reports():
    print(decode_report(r)["message"], file=sys.stderr)


def load(*, quiet: bool = False) -> Any | None:
  """Loads the extension once and returns it, or None (see `reason()`).

  Idempotent and thread-safe. Without CUDA, an extension or a matching NCCL
  it returns None and logs nothing: the lowering records why (reason
  "extension"). With a working extension and a (jax, NCCL) pair outside
  TESTED_VERSIONS it logs a warning once on the ``jax_llar`` logger, unless
  `quiet` (``jax_llar.status()`` loads quietly).
  """
  with _lock:
    if not _loaded:
      _load_locked()
    mod = _module
  if mod is not None and not quiet:
    _warn_if_untested(mod)
  return mod


_identity: str | None = None


def build_identity() -> str | None:
  """The loaded extension's build: 16 hex digits of a SHA-256 over the bytes
  of its libraries (``jax_llar._llar`` and ``libllar_core.so`` beside it)
  and the constants it exports (``ALGORITHMS``, ``MAX_BYTES``, ...), or None
  when no extension is loaded. Every fast-path call carries it
  (``jax_llar.lowering.emit_call``), so that an executable compiled for one
  build never serves another through JAX's persistent compilation cache,
  whose key holds the program but not the native library
  (jax-ml/jax#18750). Computed once; loads nothing."""
  global _identity
  mod = _module
  if mod is None:
    return None
  with _lock:
    if _identity is None:
      h = hashlib.sha256()
      path = getattr(mod, "__file__", None)
      for f in (path, os.path.join(os.path.dirname(path), "libllar_core.so") if path else None):
        if f and os.path.isfile(f):
          with open(f, "rb") as lib:
            h.update(lib.read())
      for name in ("ALGORITHMS", "MAX_BYTES", "MAX_RANKS", "SIGNED", "SIGNATURE_BITS",
                   "FUSED_MAX_BYTES", "FUSED_BLOCK_LINES", "FUSED_MAX_CLUSTER_BLOCKS"):
        h.update(f"{name}={getattr(mod, name, None)!r};".encode())
      _identity = h.hexdigest()[:16]
    return _identity


def loaded() -> Any | None:
  """The extension module if `load` already succeeded, else None; never
  loads anything."""
  return _module


def reason() -> str | None:
  """Why the extension is unavailable, or None when it is loaded (or when
  loading was not tried yet)."""
  return _reason


def built() -> bool:
  """True when the CUDA extension was compiled into this installation."""
  return importlib.util.find_spec("jax_llar._llar") is not None


def build_info() -> dict[str, Any] | None:
  """What the CUDA build recorded (``jax_llar._build_info``, generated by
  CMake), or None in a tree without a CUDA build. Never raises: a generated
  module that cannot be imported or read (of another build, damaged) also
  gives None.

  Returns:
    ``{"nccl_version_code": int, "cuda_version": str,
    "cuda_architectures": str, "jaxlib_version": str | None,
    "xla_ffi_api_version": [int, int] | None}``: the NCCL
    headers' NCCL_VERSION_CODE, the nvcc version, the CUDA architectures
    (e.g. ``"90;100"``) and the version of the jaxlib whose XLA FFI headers
    the handlers were compiled against and their XLA FFI API version
    (major, minor) (each None from a build that predates that record).
  """
  try:
    info = importlib.import_module("jax_llar._build_info")
    jaxlib_version = getattr(info, "JAXLIB_VERSION", None)
    return {
        "nccl_version_code": int(info.NCCL_VERSION_CODE),
        "cuda_version": str(info.CUDA_VERSION),
        "cuda_architectures": str(info.CUDA_ARCHITECTURES),
        "jaxlib_version": (str(jaxlib_version) if jaxlib_version is not None
                           else None),
        "xla_ffi_api_version": (list(built_ffi_api_version() or ()) or None),
    }
  except Exception:  # pylint: disable=broad-exception-caught
    return None
