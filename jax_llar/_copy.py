"""The trivial custom call ``jax_llar_copy`` (impl ``xla.custom_call_copy``).

A copy kernel registered exactly like the all-reduce (same FFI path,
``kCmdBufferCompatible``). A chain of it measures XLA's own cost per custom
call step, which the all-reduce cannot remove (BENCHMARK.md, JAX level).
On other platforms it lowers to the identity.
"""

from __future__ import annotations

import jax
from jax._src import core
from jax._src.interpreters import mlir

from jax_llar import _ext

copy_p = core.Primitive("llar_copy")
copy_p.def_abstract_eval(lambda aval: aval)
copy_p.def_impl(lambda x: x)


def copy(x):
  """Returns a copy of array `x` (same shape, dtype and typing) made by the
  ``jax_llar_copy`` FFI custom call on CUDA.

  Raises:
    RuntimeError: on CUDA when the extension is unavailable.
  """
  return copy_p.bind(x)


def _lowering_cuda(ctx, x):
  if _ext.load() is None:
    raise RuntimeError(f"jax_llar copy: {_ext.reason()}")
  return jax.ffi.ffi_lowering(_ext.TARGET_COPY)(ctx, x)


mlir.register_lowering(copy_p, lambda ctx, x: [x])
mlir.register_lowering(copy_p, _lowering_cuda, platform="cuda")
