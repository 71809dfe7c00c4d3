"""``jax_llar.psum`` and its primitive ``llar_psum_p``.

The primitive keeps the semantics of ``lax.psum`` over named mesh axes; only
its lowering differs (``jax_llar.lowering``). Its rules are kept beside it, as
``jax/_src/lax/parallel.py`` does for JAX's collectives:
  abstract eval  same shape and dtype; with ``check_vma`` the reduced axes
                 leave the varying-manual-axes set (like ``psum_invariant_p``);
  transpose      with ``check_vma``: ``pvary`` of the cotangent (no
                 communication); without: a psum of the cotangent, through
                 jax_llar again (like ``psum_p``);
  batching       a vmapped axis among the reduced names becomes a positional
                 sum; other axes pass through;
  lowering       ``jax_llar.lowering``: CUDA and every other platform decide
                 the same way; only CUDA can emit the FFI call.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax import lax
from jax._src import config as jax_config
from jax._src import core
from jax._src.interpreters import ad, batching, mlir

from jax_llar import log, lowering

# The original function, captured at import (jax_llar.swap_psum replaces the
# attribute jax.lax.psum): every case handed to lax.psum must reach XLA's.
_lax_psum = lax.psum


def psum(x: Any, axis_name, *, axis_index_groups=None) -> Any:
  """Compute an all-reduce sum on ``x`` over the mapped axis ``axis_name``.

  The same function as ``jax.lax.psum``: use it inside ``jax.shard_map`` (or
  ``vmap``/``pmap`` with named axes). Small psums of a jitted ``shard_map``
  on CUDA GPUs that are NVLink peers run as a barrier-free one-shot LL
  all-reduce (arXiv 2607.16100, section 4.1) through an XLA FFI custom call;
  every other psum lowers exactly like ``lax.psum``. The README says which
  psums take the fast path; ``jax_llar.dispatch_log()`` shows what each psum
  of a program did, and why.

  Args:
    x: array(s) with a mapped axis named ``axis_name``: an array or a pytree
      of arrays, any shape; each leaf is reduced separately. Python and numpy
      constants give the constant times the number of ranks, as with
      ``lax.psum``.
    axis_name: hashable Python object naming a mapped axis, or a tuple of
      them (reduced together). Positional (integer) axes sum over array
      dimensions, as in ``lax.psum``.
    axis_index_groups: optional list of lists of axis indices, as in
      ``lax.psum`` (only with ``check_vma=False``); such psums are always
      ``lax.psum``'s.

  Returns:
    Array(s) with the same structure, shapes and dtypes as ``x``: the
    elementwise sum over the ranks of each replica group (bools are counted
    as int32, as ``lax.psum`` does). With ``check_vma=True`` the result is
    invariant over the reduced axes, exactly like ``lax.psum``.
    Differentiable (``jax.grad``) and batchable (``jax.vmap``). On the fast
    path every rank's result is bitwise identical: the float64 sum in rank
    order, rounded once to the dtype; ``lax.psum`` may add in another order,
    so with more than two ranks results can differ from it in the last bit.

  Raises:
    NameError: an axis name is not bound (e.g. called outside ``shard_map``).
    ValueError: ``x`` is varying over some of the axes and invariant over
      others (the rule and message of ``lax.psum``).

  For example, with 4 devices in a mesh with axis ``"i"``::

    >>> mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]), ("i",))
    >>> f = jax.jit(jax.shard_map(lambda v: jax_llar.psum(v, "i"), mesh=mesh,
    ...                           in_specs=P("i"), out_specs=P()))
    >>> f(jnp.arange(4.0))
    Array([6.], dtype=float32)
  """
  axes = _canonical_axes(axis_name)
  if not axes:
    return x
  if axis_index_groups is not None or any(isinstance(a, int) for a in axes):
    _record_lax_only(x, axes, axis_index_groups)
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
    check_vma = bool(jax_config._check_vma.value)  # pylint: disable=protected-access
    if check_vma and state == "invarying" and jax_config.auto_pcast.value:
      leaf = core.pvary(leaf, axes)
    return llar_psum_p.bind(leaf, axes=axes, check_vma=check_vma)

  return jax.tree_util.tree_map(bind, x)


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


def _record_lax_only(x, axes: tuple, axis_index_groups) -> None:
  """Records the decision for a psum that only lax.psum serves (reason
  "axis_index_groups" or "positional_axes"), with its facts: one entry per
  leaf. The number of ranks is that of one index group, or of the named axes
  for positional axes (0 when a name is unbound: lax.psum then raises)."""
  if axis_index_groups is not None:
    reason = "axis_index_groups"
    world = len(axis_index_groups[0]) if len(axis_index_groups) else 0
  else:
    reason, world = "positional_axes", 1
    env = core.get_axis_env()
    for a in axes:
      if not isinstance(a, int):
        world = world * env.axis_size(a) if env.axis_exists(a) else 0
  for leaf in jax.tree_util.tree_leaves(x):
    aval = core.typeof(leaf)
    dt = np.dtype(aval.dtype)
    log.record(log.Decision(
        reason=reason, detail=f"psum with {reason} is lax.psum's", axes=axes,
        dtype=str(dt), world_size=world,
        bytes_per_rank=int(np.prod(aval.shape, dtype=np.int64)) * dt.itemsize))


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


# --- the primitive -------------------------------------------------------------

llar_psum_p = core.Primitive("llar_psum")


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


def _impl(x, *, axes, check_vma):
  del x, check_vma
  raise NameError(f"jax_llar.psum: unbound axis name(s) {axes}: call it inside "
                  "jax.shard_map")


def _transpose(ct, x, *, axes, check_vma):
  assert ad.is_undefined_primal(x)
  if type(ct) is ad.Zero:
    return [ad.Zero(x.aval)]
  if check_vma:
    return [core.pvary(ct, axes)]
  return [llar_psum_p.bind(ct, axes=axes, check_vma=False)]


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


llar_psum_p.def_effectful_abstract_eval(_abstract_eval)
llar_psum_p.def_impl(_impl)
ad.deflinear2(llar_psum_p, _transpose)
batching.fancy_primitive_batchers[llar_psum_p] = _batch
mlir.register_lowering(llar_psum_p, lowering.lowering_default)
mlir.register_lowering(llar_psum_p, lowering.lowering_cuda, platform="cuda")
