"""``jax_llar.psum``: ``lax.psum``, marked for the fast path.

The call binds JAX's own psum primitives (``lax.psum`` does the binding), with
the equation marked through JAX's XLA metadata (``jax_llar.swap``). Every
rule but the lowering is JAX's: abstract evaluation, ``check_vma`` types,
transposes, batching, checkify, roofline and the errors. The lowering
(``jax_llar.lowering``) sends a marked psum through the dispatch policy.
"""

from __future__ import annotations

from typing import Any

from jax import lax
from jax._src import core

from jax_llar import swap


def psum(x: Any, axis_name, *, axis_index_groups=None) -> Any:
  """Compute an all-reduce sum on ``x`` over the mapped axis ``axis_name``.

  ``jax.lax.psum`` itself, marked for jax_llar: use it inside ``jax.shard_map``
  (or ``vmap``/``pmap`` with named axes). Small psums of a jitted
  ``shard_map`` on CUDA GPUs that are NVLink peers run as a barrier-free
  one-shot LL all-reduce (arXiv 2607.16100, section 4.1) through an XLA FFI
  custom call; every other psum lowers exactly like ``lax.psum``. The README
  says which psums take the fast path; ``jax_llar.dispatch_log()`` shows
  what each psum of a program did, and why. The psums that differentiation
  adds for this one (its transposes) are marked too.

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
    invariant over the reduced axes, exactly like ``lax.psum``. On the fast
    path every rank's result is bitwise identical: the float64 sum in rank
    order, rounded once to the dtype; ``lax.psum`` may add in another order,
    so with more than two ranks results can differ from it in the last bit.

  Raises:
    NameError: a name that no enclosing ``shard_map``/``vmap``/``pmap``
      binds: ``unbound axis name: tp (the axes bound here: 'x', 'y')``,
      inside a ``shard_map`` as outside it (where ``lax.psum`` itself raises
      an AssertionError without a message).
    ValueError: ``lax.psum``'s, for a value varying over some of the axes
      and invariant over others.

  For example, with 4 devices in a mesh with axis ``"i"``::

    >>> mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]), ("i",))
    >>> f = jax.jit(jax.shard_map(lambda v: jax_llar.psum(v, "i"), mesh=mesh,
    ...                           in_specs=P("i"), out_specs=P()))
    >>> f(jnp.arange(4.0))
    Array([6.], dtype=float32)
  """
  _check_bound(axis_name)
  with swap.mark(swap.MARK_PSUM):
    return lax.psum(x, axis_name, axis_index_groups=axis_index_groups)


def _check_bound(axis_name) -> None:
  """Raises the NameError of `psum` for a named axis that is not bound."""
  names = axis_name if isinstance(axis_name, (tuple, list)) else (axis_name,)
  try:
    bound = core.get_axis_env().axis_sizes
  except AttributeError:  # a jax without the axis environment: lax.psum's errors
    return
  for name in names:
    if isinstance(name, int) or name in bound:
      continue
    here = (f"the axes bound here: {', '.join(repr(a) for a in bound)}" if bound else
            "no axis is bound here: call it inside jax.shard_map (or vmap/pmap) over a "
            "mesh that has that axis")
    raise NameError(f"unbound axis name: {name} ({here})")
