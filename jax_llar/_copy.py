"""The trivial custom call ``jax_llar_copy`` (impl ``xla.custom_call_copy``).

A copy kernel registered exactly like the all-reduce (same FFI path,
``kCmdBufferCompatible``). A chain of it measures XLA's own cost per custom
call step, which the all-reduce cannot remove (BENCHMARK.md, JAX level).
On other platforms it lowers to the identity.

``copy_wide`` (impl ``diag.custom_call_copy_wide``) is a diagnostic twin:
the same copy kernel with a 208-byte parameter block, to measure what the
parameter bytes of a graph node cost in XLA's CUDA graph launches.
"""

from __future__ import annotations

import jax
from jax._src import core
from jax._src.interpreters import mlir

from jax_llar import _ext

copy_p = core.Primitive("llar_copy")
copy_p.def_abstract_eval(lambda aval: aval)
copy_p.def_impl(lambda x: x)
copy_wide_p = core.Primitive("llar_copy_wide")
copy_wide_p.def_abstract_eval(lambda aval: aval)
copy_wide_p.def_impl(lambda x: x)


def copy(x):
  """Returns a copy of array `x` (same shape, dtype and typing) made by the
  ``jax_llar_copy`` FFI custom call on CUDA.

  Raises:
    RuntimeError: on CUDA when the extension is unavailable.
  """
  return copy_p.bind(x)


def copy_wide(x):
  """Like `copy`, through the ``jax_llar_copy_wide`` custom call, whose kernel
  takes a 208-byte parameter block (a diagnostic; see the module docstring).

  Raises:
    RuntimeError: on CUDA when the extension is unavailable.
  """
  return copy_wide_p.bind(x)


def _lowering_cuda(target):
  def lower(ctx, x):
    if _ext.load() is None:
      raise RuntimeError(f"jax_llar copy: {_ext.reason()}")
    return jax.ffi.ffi_lowering(target)(ctx, x)
  return lower


for _p, _target in ((copy_p, _ext.TARGET_COPY), (copy_wide_p, _ext.TARGET_COPY_WIDE)):
  mlir.register_lowering(_p, lambda ctx, x: [x])
  mlir.register_lowering(_p, _lowering_cuda(_target), platform="cuda")
