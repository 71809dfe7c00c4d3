"""``jax_llar.psum`` and its primitive ``llar_psum_p``.

The primitive keeps the semantics of ``lax.psum`` over named mesh axes and
differs only in how it lowers on CUDA: through the XLA FFI custom call
``jax_llar_all_reduce`` (a barrier-free one-shot LL kernel over NVLink) when
the dispatch policy accepts the psum, else exactly like ``lax.psum``.

Rules kept beside the primitive, as ``jax/_src/lax/parallel.py`` does:
  abstract eval  same shape and dtype; with ``check_vma`` the reduced axes
                 leave the varying-manual-axes set (like ``psum_invariant_p``);
  transpose      with ``check_vma``: ``pvary`` of the cotangent (no
                 communication); without: a psum of the cotangent, through
                 jax_llar again (like ``psum_p``);
  batching       a vmapped axis among the reduced names becomes a positional
                 sum; other axes pass through;
  lowering       CUDA: dispatch, then FFI call or the lowering of lax.psum;
                 every other platform: the lowering of lax.psum.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax import lax
from jax._src import config as jax_config
from jax._src import core
from jax._src.interpreters import ad, batching, mlir

from jax_llar import _ext, _log, dispatch

# The original function: jax_llar.swap_psum replaces the attribute jax.lax.psum,
# and every fallback here must still reach XLA's psum.
_lax_psum = lax.psum

llar_psum_p = core.Primitive("llar_psum")


def _canonical_axes(axis_name) -> tuple:
  return tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)


def _check_bound(axes: tuple) -> None:
  env = core.get_axis_env()
  for a in axes:
    if not env.axis_exists(a):
      raise NameError(
          f"jax_llar.psum: unbound axis name {a!r}. Call jax_llar.psum inside "
          f"jax.shard_map (or vmap/pmap) over a mesh with that axis; bound "
          f"axes here: {env.axis_names()}")


def psum(x: Any, axis_name, *, axis_index_groups=None) -> Any:
  """All-reduce sum of `x` over the mesh axis `axis_name`, like ``lax.psum``.

  Inside a jitted ``jax.shard_map`` on CUDA GPUs, small psums (up to 256 KiB
  per rank; float32, bfloat16, float16; 2 to 16 ranks of one process that are
  NVLink peers) run as a barrier-free one-shot LL all-reduce (arXiv
  2607.16100, section 4.1) through an XLA FFI custom call captured in XLA's
  CUDA graph. Everything else lowers to ``lax.psum`` and the reason is logged
  once (see ``jax_llar.dispatch_log()``).

  Args:
    x: array or pytree of arrays, any shape. Each leaf is reduced separately.
    axis_name: a mesh axis name or a tuple of names (reduced together).
    axis_index_groups: as in ``lax.psum``; not served by the fast path (the
      call is ``lax.psum``, logged once).

  Returns:
    Same structure, shapes and dtypes as `x`: the elementwise sum over all
    ranks of each replica group. On the fast path every rank's result is
    bitwise identical, equal to a float64 sum in rank order rounded once to
    the dtype. With ``check_vma=True`` the result is typed invariant over the
    reduced axes, exactly like ``lax.psum``. Differentiable (``jax.grad``) and
    batchable (``jax.vmap``) like ``lax.psum``.

    The fast path adds in float64 in rank order; ``lax.psum`` (NCCL) may add
    in another order, so beyond two ranks results can differ from
    ``lax.psum`` in the last bit. ``JAX_LLAR_MAX_BYTES`` lowers the size limit.
    Positional (integer) axes and ``axis_index_groups`` are ``lax.psum``'s.
    Names of ``vmap``/``pmap`` axes work as they do for ``lax.psum``.

  Raises:
    NameError: an axis name is not bound (called outside ``shard_map``).
    ValueError: `x` is varying over some of the axes and not others (the
      same rule and message as ``lax.psum``).
  """
  axes = _canonical_axes(axis_name)
  if not axes:
    return x
  if axis_index_groups is not None or any(isinstance(a, int) for a in axes):
    reason = ("axis_index_groups" if axis_index_groups is not None
              else "positional_axes")
    for leaf in jax.tree_util.tree_leaves(x):
      aval = core.typeof(leaf)
      dt = np.dtype(aval.dtype)
      _log.record(_log.Decision(
          "lax.psum", reason, f"psum with {reason} is lax.psum's",
          axes, str(dt), int(np.prod(aval.shape, dtype=np.int64)) * dt.itemsize))
    return _lax_psum(x, axis_name, axis_index_groups=axis_index_groups)
  _check_bound(axes)

  def bind(leaf):
    if not isinstance(leaf, core.Tracer):
      return _lax_psum(leaf, axes)  # constants: lax multiplies by the axis size
    aval = core.typeof(leaf)
    if jax.dtypes.issubdtype(aval.dtype, jax.dtypes.extended):
      return _lax_psum(leaf, axes)  # e.g. PRNG keys: lax's own rules and errors
    # The same type rule as lax.psum: all axes varying, or all invariant (then
    # auto_pcast makes them varying); mixed states are an error.
    state = _axes_state(aval, axes)
    if np.dtype(aval.dtype) == np.bool_ or state in ("unreduced", "reduced"):
      return _lax_psum(leaf, axes)  # lax converts bools; (un)reduced types are lax's
    check_vma = bool(jax_config._check_vma.value)
    if check_vma and state == "invarying" and jax_config.auto_pcast.value:
      leaf = core.pvary(leaf, axes)
    return llar_psum_p.bind(leaf, axes=axes, check_vma=check_vma)

  return jax.tree_util.tree_map(bind, x)


def _axes_state(aval, axes) -> str:
  """'varying', 'invarying', 'unreduced' or 'reduced' for all of `axes`;
  raises ValueError when they differ (lax.psum's rule)."""
  mat = aval.mat
  states = set()
  for a in axes:
    if a in mat.varying:
      states.add("varying")
    elif a in getattr(mat, "unreduced", ()):
      states.add("unreduced")
    elif a in getattr(mat, "reduced", ()):
      states.add("reduced")
    else:
      states.add("invarying")
  if len(states) > 1:
    raise ValueError(
        "jax.lax.psum can only accept axis_name which corresponds to one of "
        "varying, unreduced, reduced or invarying state of the input. Got "
        f"input type: {aval}, axes: {axes} and input state: {states}")
  return states.pop()


# --- abstract evaluation ---------------------------------------------------


def _abstract_eval(aval, *, axes, check_vma):
  for a in axes:
    core.get_axis_env().axis_size(a)  # NameError for unbound names
  effects = {core.NamedAxisEffect(a) for a in axes}
  if not check_vma:
    return core.ShapedArray(aval.shape, aval.dtype, sharding=aval.sharding), effects
  if not set(axes) & aval.mat.varying:
    raise ValueError(
        "psum is a variant->invariant collective. This means that the axis "
        "names mentioned in `axes` passed to `psum` must be present in "
        f"`jax.typeof(inp).mat.varying`. Got axes={axes} and "
        f"jax.typeof(inp).mat.varying={aval.mat.varying}")
  core.check_avals_context_mesh([aval], "jax_llar.psum")
  vma = frozenset(a for a in aval.mat.varying if a not in axes)
  return aval.update(manual_axis_type=aval.mat.update(varying=vma)), effects


llar_psum_p.def_effectful_abstract_eval(_abstract_eval)


def _impl(x, *, axes, check_vma):
  del x, check_vma
  raise NameError(f"jax_llar.psum: unbound axis name(s) {axes}: call it inside "
                  "jax.shard_map")


llar_psum_p.def_impl(_impl)


# --- autodiff ----------------------------------------------------------------


def _transpose(ct, x, *, axes, check_vma):
  assert ad.is_undefined_primal(x)
  if type(ct) is ad.Zero:
    return [ad.Zero(x.aval)]
  if check_vma:
    return [core.pvary(ct, axes)]
  return [llar_psum_p.bind(ct, axes=axes, check_vma=False)]


ad.deflinear2(llar_psum_p, _transpose)


# --- batching ------------------------------------------------------------------


def _batch(axis_data, vals_in, dims_in, *, axes, check_vma):
  (v,), (d,) = vals_in, dims_in
  if axis_data.name not in axes:
    return llar_psum_p.bind(v, axes=axes, check_vma=check_vma), d
  rest = tuple(a for a in axes if a != axis_data.name)
  if d is None:
    # Unmapped value summed over the vmapped axis: reduce the rest first, then
    # scale, in the order lax.psum's batching rule uses.
    out = llar_psum_p.bind(v, axes=rest, check_vma=check_vma) if rest else v
    return out * lax.convert_element_type(axis_data.size, out.dtype), None
  out = lax.reduce_sum(v, (d,))
  if rest:
    out = llar_psum_p.bind(out, axes=rest, check_vma=check_vma)
  return out, None


batching.fancy_primitive_batchers[llar_psum_p] = _batch


# --- lowering ----------------------------------------------------------------


def _lax_psum_lowering(ctx, x, *, axes, check_vma):
  def f(v):
    with jax_config._check_vma(check_vma):
      return _lax_psum(v, axes)
  return mlir.lower_fun(f, multiple_results=False)(ctx, x)


def _lowering_default(ctx, x, *, axes, check_vma):
  aval = ctx.avals_in[0]
  dtype = np.dtype(aval.dtype)
  _log.record(_log.Decision(
      "lax.psum", "platform",
      f"platform {', '.join(ctx.module_context.platforms)}: the fast path is "
      "CUDA-only", tuple(axes), str(dtype),
      int(np.prod(aval.shape, dtype=np.int64)) * dtype.itemsize))
  return _lax_psum_lowering(ctx, x, axes=axes, check_vma=check_vma)


def _lowering_cuda(ctx, x, *, axes, check_vma):
  decision = dispatch.decide(ctx.module_context.axis_context, ctx.avals_in[0], axes)
  if not decision.fast:
    return _lax_psum_lowering(ctx, x, axes=axes, check_vma=check_vma)
  return jax.ffi.ffi_lowering(_ext.TARGET_ALL_REDUCE)(
      ctx, x, comm_id=np.int64(decision.comm_id),
      comm_key=np.int64(decision.comm_key),
      algorithm=np.int64(dispatch.algorithm_id(decision)))


mlir.register_lowering(llar_psum_p, _lowering_default)
mlir.register_lowering(llar_psum_p, _lowering_cuda, platform="cuda")
