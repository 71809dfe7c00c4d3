"""The copy custom call: XLA's own cost per custom-call step.

``copy(x)`` (impl name ``ffi.copy``) is a copy kernel behind the same FFI
path as the all-reduce: an execute-only handler with the command-buffer
trait, registered for CUDA by `jax_llar.tools._native.load`. A chain of it
measures what XLA charges per custom-call step, which no all-reduce kernel
can remove. ``copy_wide(x)`` (impl name ``diag.ffi_copy_wide``) is a
diagnostic twin whose kernel takes a 208-byte parameter block: it shows what
the parameter bytes of a graph node cost. On platforms other than CUDA both
lower to the identity.
"""

from __future__ import annotations

import jax
from jax.extend import core as jex_core
from jax.interpreters import mlir

from jax_llar.tools import _native

TARGET_COPY = "jax_llar_copy"
TARGET_COPY_WIDE = "jax_llar_copy_wide"
IMPL_COPY = "ffi.copy"
IMPL_COPY_WIDE = "diag.ffi_copy_wide"

copy_p = jex_core.Primitive("llar_copy")
copy_wide_p = jex_core.Primitive("llar_copy_wide")
for _p in (copy_p, copy_wide_p):
  _p.def_abstract_eval(lambda aval: aval)
  _p.def_impl(lambda x: x)


def copy(x: jax.Array) -> jax.Array:
  """Returns a copy of `x` (same shape, dtype and typing).

  On CUDA the copy is the ``jax_llar_copy`` FFI custom call, one kernel
  launch; elsewhere it is the identity.

  Raises:
    RuntimeError: at lowering for CUDA when the native tools module is
      unavailable (the message says why).
  """
  return copy_p.bind(x)


def copy_wide(x: jax.Array) -> jax.Array:
  """Like `copy`, through ``jax_llar_copy_wide``, whose kernel takes a
  208-byte parameter block (a diagnostic).

  Raises:
    RuntimeError: at lowering for CUDA when the native tools module is
      unavailable.
  """
  return copy_wide_p.bind(x)


def _cuda_lowering(target: str):
  def lower(ctx, x):
    _native.require(f"the copy call {target}")
    return jax.ffi.ffi_lowering(target)(ctx, x)
  return lower


for _p, _target in ((copy_p, TARGET_COPY), (copy_wide_p, TARGET_COPY_WIDE)):
  mlir.register_lowering(_p, lambda ctx, x: [x])
  mlir.register_lowering(_p, _cuda_lowering(_target), platform="cuda")
