"""Loads the native tools module ``jax_llar.tools._llar_tools``.

The tools module holds what production does not need: the kernel bench, the
speed-of-light probes, the call trace, the test hooks and the copy kernels
with their FFI handlers. It links the same core library as ``jax_llar._llar``
and reads that module's communicator registry, so it is imported only after
``jax_llar._ext.load()`` has returned the production module (which binds the
process's ``libnccl.so.2`` first). Loading registers the copy kernels' FFI
targets for the CUDA platform.
"""

from __future__ import annotations

import importlib
import importlib.util
import threading
from typing import Any

import jax

from jax_llar import _ext

MODULE = "jax_llar.tools._llar_tools"

_lock = threading.Lock()
_module: Any = None
_reason: str | None = None
_loaded = False


def _load_locked() -> None:
  global _module, _reason, _loaded
  _loaded = True
  if _ext.load() is None:
    _reason = f"the jax_llar extension is unavailable: {_ext.reason()}"
    return
  if importlib.util.find_spec(MODULE) is None:
    _reason = (f"the native tools module {MODULE} is not built (no CUDA "
               "compiler at install time)")
    return
  try:
    mod = importlib.import_module(MODULE)
  except ImportError as e:
    _reason = f"cannot import {MODULE}: {e}"
    return
  try:
    for name, capsule in mod.registrations().items():
      jax.ffi.register_ffi_target(name, capsule, platform="CUDA")
  except Exception as e:  # noqa: BLE001 - kept as the reason, see require()
    _reason = (f"cannot register the FFI targets of {MODULE}: "
               f"{type(e).__name__}: {e}")
    return
  _module = mod


def load() -> Any | None:
  """Returns the native tools module, or None (see `reason`); idempotent.

  The first call loads ``jax_llar._ext`` (which needs JAX's CUDA backend),
  imports the tools module and registers its FFI targets
  (``jax_llar_copy``, ``jax_llar_copy_wide``, ``jax_llar_loopback_all_reduce``,
  ``jax_llar_loopback_add_rms_norm``) with
  ``jax.ffi.register_ffi_target(..., platform="CUDA")``.
  """
  with _lock:
    if not _loaded:
      _load_locked()
    return _module


def reason() -> str | None:
  """Why the tools module is unavailable, or None when it is loaded."""
  return _reason


def require(what: str) -> Any:
  """Returns the tools module.

  Raises:
    RuntimeError: naming `what` and the reason when it cannot be loaded.
  """
  mod = load()
  if mod is None:
    raise RuntimeError(f"{what} needs the native tools module: {reason()}")
  return mod
