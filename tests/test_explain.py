"""``jax_llar.explain``: psums in rolled loops are found from the jaxpr alone.

Decision tested here: a scan unrolled by 8 or more (or completely) counts as
straight-line code and gets no finding; smaller unroll factors (2-7) get one,
whose advice says how far to unroll.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import Mesh, PartitionSpec as P

import jax_llar
from jax_llar.explain import PSUM_PRIMITIVES


def _mesh():
  return Mesh(np.array(jax.devices()[:2]), ("x",))


def _sm(body, check_vma=False):
  return jax.jit(jax.shard_map(body, mesh=_mesh(), in_specs=P("x"), out_specs=P("x"),
                               check_vma=check_vma))


X = jax.ShapeDtypeStruct((8,), jnp.float32)


def _step(v):
  return jax_llar.psum(v, "x") * 0.5


def test_rolled_fori_loop_is_found():
  f = _sm(lambda v: lax.fori_loop(0, 64, lambda i, c: _step(c), v))
  found = jax_llar.explain(f, X)
  assert len(found) == 1
  (x,) = found
  assert (x.primitive, x.requested) == ("psum", "psum")  # check_vma=False
  assert x.loop == "scan"  # static bounds: fori_loop is a scan
  assert x.trip_count == 64 and x.unroll == 1 and x.depth == 1
  assert not x.in_predicate
  assert x.body_equations >= 2
  assert "Getting the speed in loops" in x.advice and "unroll" in x.advice
  assert "rolled scan" in str(x) and "64 trips" in str(x)
  assert "test_explain.py" in x.where


def test_fori_loop_with_traced_bounds_is_a_while():
  def body(v):
    n = jnp.int32(16) + lax.axis_index("x") * 0
    return lax.fori_loop(0, n, lambda i, c: _step(c), v)
  (x,) = jax_llar.explain(_sm(body), X)
  assert x.loop == "while" and x.trip_count is None


def test_lax_psum_in_while_loop_and_its_predicate():
  def body(v):
    def cond(c):
      i, s = c
      return (i < 10) & (lax.psum(jnp.sum(s * s), "x") > 1e-6)
    return lax.while_loop(cond, lambda c: (c[0] + 1, lax.psum(c[1], "x") * 0.5),
                          (0, v))[1]
  found = jax_llar.explain(_sm(body), X)
  assert [(x.primitive, x.loop, x.in_predicate) for x in found] == [
      ("psum", "while", False), ("psum", "while", True)]
  assert "predicate" in found[1].advice


def test_psum_invariant_with_check_vma_is_found():
  f = _sm(lambda v: lax.fori_loop(0, 8, lambda i, c: c + lax.psum(c, "x"), v),
          check_vma=True)
  found = jax_llar.explain(f, X)
  assert len(found) == 1 and found[0].primitive in PSUM_PRIMITIVES


def test_scan_unrolled_by_8_or_fully_is_not_found():
  def body(v, unroll):
    return lax.scan(lambda c, _: (_step(c), None), v, None, length=64, unroll=unroll)[0]
  assert jax_llar.explain(_sm(lambda v: body(v, 8)), X) == []
  assert jax_llar.explain(_sm(lambda v: body(v, 16)), X) == []
  assert jax_llar.explain(_sm(lambda v: body(v, True)), X) == []


def test_scan_with_a_small_unroll_factor_gets_a_note():
  f = _sm(lambda v: lax.scan(lambda c, _: (_step(c), None), v, None, length=64,
                             unroll=4)[0])
  (x,) = jax_llar.explain(f, X)
  assert x.unroll == 4 and x.trip_count == 16
  assert "8 or more" in x.advice


def test_straight_line_is_not_found():
  def body(v):
    for _ in range(16):
      v = _step(v)
    return lax.psum(v, "x")
  assert jax_llar.explain(_sm(body), X) == []


def test_loop_without_psum_is_not_found():
  f = _sm(lambda v: lax.fori_loop(0, 64, lambda i, c: c * 0.5, v))
  assert jax_llar.explain(f, X) == []


def test_nested_loops_name_the_innermost_rolled_loop():
  def body(v):
    def outer(c):
      i, s = c
      s = lax.fori_loop(0, 3, lambda j, t: _step(t), s)           # rolled inner
      s = lax.scan(lambda t, _: (_step(t), None), s, None, length=2,
                   unroll=2)[0]                                     # unrolled inner
      return i + 1, _step(s)
    return lax.while_loop(lambda c: c[0] < 3, outer, (0, v))[1]
  found = jax_llar.explain(_sm(body), X)
  assert [(x.loop, x.depth, x.trip_count, x.psums_per_trip) for x in found] == [
      ("scan", 2, 3, 1),        # in the rolled fori_loop, inside the while
      ("while", 1, None, 6),    # the unrolled scan's psum belongs to the while
      ("while", 1, None, 6),    # the step after it
  ]
  assert found[0].body_equations < found[1].body_equations


def test_a_trip_of_8_steps_is_enough_but_not_in_a_predicate():
  def eight(i, c):
    for _ in range(8):
      c = _step(c)
    return c
  assert jax_llar.explain(_sm(lambda v: lax.fori_loop(0, 64, eight, v)), X) == []
  # An outer rolled loop whose trip runs an inner scan of 8 steps is enough too.
  inner = lambda c: lax.fori_loop(0, 8, lambda j, t: _step(t), c)  # noqa: E731
  found = jax_llar.explain(_sm(lambda v: lax.fori_loop(0, 4, lambda i, c: inner(c), v)), X)
  assert [(x.loop, x.depth, x.trip_count) for x in found] == [("scan", 1, 8)]

  def with_pred(v):
    def cond(c):
      return jax_llar.psum(jnp.sum(c[1]), "x") > 0
    return lax.while_loop(cond, lambda c: (c[0] + 1, eight(0, c[1])), (0, v))[1]
  found = jax_llar.explain(_sm(with_pred), X)
  assert [(x.in_predicate, x.psums_per_trip) for x in found] == [(True, 9)]


def test_recurses_into_cond_custom_jvp_remat_and_nested_jit():
  @jax.custom_jvp
  def g(v):
    return jax_llar.psum(v, "x")

  g.defjvp(lambda primals, tangents: (g(primals[0]), tangents[0]))

  inner = jax.jit(lambda v: lax.cond(v[0] > 0, lambda u: lax.psum(u, "x"),
                                     lambda u: u, v))

  def step(i, c):
    c = inner(c)
    c = jax.checkpoint(lambda u: g(u) * 2)(c)
    return c

  found = jax_llar.explain(_sm(lambda v: lax.fori_loop(0, 8, step, v)), X)
  assert sorted((x.primitive, str(x.requested)) for x in found) == [
      ("psum", "None"), ("psum", "psum")]
  assert all(x.loop == "scan" and x.trip_count == 8 for x in found)


def test_accepts_arrays_and_kwargs_and_does_not_compile():
  def body(v, *, scale):
    return lax.fori_loop(0, 4, lambda i, c: _step(c) * scale, v)

  def f(v, scale=2.0):
    return _sm(lambda u: body(u, scale=scale))(v)

  found = jax_llar.explain(f, jnp.ones(8), scale=3.0)
  assert len(found) == 1
  # Traced once, never run: no dispatch decision is logged without lowering.
  assert jax_llar.dispatch_log() == []


def test_unbound_axis_raises_like_tracing():
  f = jax.jit(lambda v: lax.fori_loop(0, 4, lambda i, c: jax_llar.psum(c, "nope"), v))
  with pytest.raises(NameError):
    jax_llar.explain(f, X)


def test_the_fused_op_in_a_rolled_scan_is_named_as_jax_llars():
  """psum_add_rms_norm is always jax_llar's decision: its finding says so,
  not "JAX's lowering" (it binds no swap mark)."""
  w = jnp.ones((8,), jnp.float32)

  def body(x):
    def step(carry, _):
      normed, residual = jax_llar.psum_add_rms_norm(carry, carry, w, "x")
      return normed + residual, None
    return lax.scan(step, x, None, length=16)[0]

  f = jax.jit(jax.shard_map(body, mesh=_mesh(), in_specs=P("x"), out_specs=P("x"),
                            check_vma=False))
  (x,) = jax_llar.explain(f, jax.ShapeDtypeStruct((2, 8), jnp.float32))
  assert (x.primitive, x.requested) == ("llar_psum_add_rms_norm", "psum_add_rms_norm")
  assert "[jax_llar (psum_add_rms_norm)]" in str(x) and "JAX's lowering" not in str(x)
