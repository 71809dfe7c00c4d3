"""jax_llar.psum has the semantics of lax.psum (CPU, 8 forced host devices).

On host devices every psum lowers like ``lax.psum``, so values must be
bitwise those of ``lax.psum``; the typing (varying manual axes,
``out_specs``), autodiff, batching, control flow and the errors must behave
the same. Lowering decisions are tests/test_lowering.py's, the swap
tests/test_swap.py's.

Meshes use 2, 4 or 8 of the host devices (tests/cpu_helpers.py). Known bugs
of jax_llar would be marked ``xfail(strict=True)`` with the reason: the
assertion states the correct behaviour, and the marker must go when the bug
is fixed.
"""

from __future__ import annotations

import functools
import logging

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings as hyp_settings, strategies as st
from jax import lax
from jax._src import config as jax_config
from jax.sharding import PartitionSpec as P

import jax_llar
from jax_llar import testing

from cpu_helpers import (BF16, CASE_IDS, FLOAT_DTYPES, MESH_CASES, ONE_D,
                         ONE_D_IDS, SOME_CASES, SOME_IDS, assert_bitwise,
                         axes_tuple, check_against_reference, index_groups,
                         mesh_of, outcome, random_input, shard_psum, x64_if)


# --- values ------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype", ["float32", "bfloat16", "float16", "float64", "int32", "bool"])
@pytest.mark.parametrize("case", MESH_CASES, ids=CASE_IDS)
def test_values_bitwise_equal_lax_psum(case, dtype):
  shape, names, axes = case
  mesh = mesh_of(shape, names)
  dtype = np.dtype(BF16 if dtype == "bfloat16" else dtype)
  rng = np.random.default_rng(1)
  with x64_if(dtype):
    x = random_input(rng, (mesh.size, 3, 5), dtype)
    want = shard_psum(lax.psum, mesh, axes, x)
    got = shard_psum(jax_llar.psum, mesh, axes, x)
  assert_bitwise(got, want)
  check_against_reference(got, x, index_groups(shape, names, axes))


@pytest.mark.parametrize("shape", [(), (0,), (1,), (7,), (2, 0, 3), (3, 17)],
                         ids=str)
@pytest.mark.parametrize("case", ONE_D + [MESH_CASES[7]],
                         ids=ONE_D_IDS + [CASE_IDS[7]])
def test_shapes_scalars_and_empty(case, shape):
  mesh_shape, names, axes = case
  mesh = mesh_of(mesh_shape, names)
  rng = np.random.default_rng(2)
  for dtype in (np.float32, BF16):
    x = random_input(rng, (mesh.size,) + shape, dtype)
    want = shard_psum(lax.psum, mesh, axes, x)
    got = shard_psum(jax_llar.psum, mesh, axes, x)
    assert got.shape == (mesh.size,) + shape
    assert_bitwise(got, want)
    check_against_reference(got, x, index_groups(mesh_shape, names, axes))


@pytest.mark.parametrize("case", [MESH_CASES[2], MESH_CASES[8]],
                         ids=[CASE_IDS[2], CASE_IDS[8]])
def test_pytree(case):
  shape, names, axes = case
  mesh = mesh_of(shape, names)
  n = mesh.size
  rng = np.random.default_rng(3)
  x = {
      "w": random_input(rng, (n, 3, 4), np.float32),
      "nested": (random_input(rng, (n, 5), BF16),
                 random_input(rng, (n, 2), np.int32),
                 [random_input(rng, (n,), np.float16)]),
      "flag": random_input(rng, (n, 3), np.bool_),
  }
  want = shard_psum(lax.psum, mesh, axes, x)
  got = shard_psum(jax_llar.psum, mesh, axes, x)
  assert jax.tree.structure(got) == jax.tree.structure(x)
  groups = index_groups(shape, names, axes)
  for g, w, xi in zip(jax.tree.leaves(got), jax.tree.leaves(want),
                      jax.tree.leaves(x)):
    assert_bitwise(g, w)
    check_against_reference(g, xi, groups)


@pytest.mark.parametrize("case", MESH_CASES, ids=CASE_IDS)
def test_python_constants(case):
  """psum(1, axes) is the group size, as lax.psum computes it without a
  collective; a float, a numpy constant and a constant inside a pytree next
  to a traced leaf behave like lax.psum too."""
  shape, names, axes = case
  mesh = mesh_of(shape, names)
  group = index_groups(shape, names, axes).shape[1]
  x = random_input(np.random.default_rng(4), (mesh.size, 3), np.float32)
  spec = P(tuple(names))
  traced_types = {}

  def make(fn):
    def body(v):
      one = fn(1, axes)
      traced_types.setdefault(fn, type(one))
      mixed = fn((1, v[0], 2.5), axes)
      return (jnp.asarray(one), jnp.asarray(fn(2.5, axes)),
              jnp.asarray(fn(np.float32(1.5), axes)), mixed[0], mixed[2],
              mixed[1][None])
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec,
                                 out_specs=(P(),) * 5 + (spec,)))

  want = make(lax.psum)(x)
  got = make(jax_llar.psum)(x)
  assert traced_types[jax_llar.psum] is traced_types[lax.psum]
  for g, w in zip(got, want):
    assert_bitwise(g, w)
  assert int(got[0]) == group
  assert float(got[1]) == 2.5 * group
  assert float(got[2]) == 1.5 * group
  assert int(got[3]) == group and float(got[4]) == 2.5 * group


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_special_values(dtype):
  """F1: -0.0, +0.0, subnormals, NaN payloads, +-inf, all zeros (4 ranks)."""
  dtype = np.dtype(BF16 if dtype == "bfloat16" else dtype)
  uint = {2: np.uint16, 4: np.uint32}[dtype.itemsize]
  nan_bits = {np.dtype(np.float32): (0x7FC00001, 0xFFC00000, 0x7F800001),
              BF16: (0x7FC1, 0xFFC0, 0x7F81),
              np.dtype(np.float16): (0x7E01, 0xFE00, 0x7C01)}[dtype]
  tiny = float(ml_dtypes.finfo(dtype).smallest_subnormal)
  inf, nan = np.inf, np.nan
  columns = [  # one column: the 4 ranks' values at one position
      [-0.0, -0.0, -0.0, -0.0],
      [0.0, 0.0, 0.0, 0.0],
      [-0.0, 0.0, -0.0, -0.0],
      [tiny, -tiny, tiny, tiny],
      [-tiny, -tiny, 0.0, -0.0],
      [nan, 1.0, 2.0, 3.0],
      [1.0, nan, nan, 3.0],
      [inf, 1.0, 2.0, 3.0],
      [-inf, 1.0, -2.0, 3.0],
      [inf, -inf, 1.0, 2.0],
      [inf, inf, -1.0, 0.5],
  ]
  x = np.array(columns, np.float64).T.astype(dtype)
  # NaNs with several payloads (quiet, negative, signalling).
  for (rank, col), b in zip([(0, 5), (1, 6), (2, 6)], nan_bits):
    x.view(uint)[rank, col] = b
  with np.errstate(invalid="ignore"):  # signalling NaNs
    assert np.isnan(x.astype(np.float64)).sum() == 3
  mesh = mesh_of((4,), ("x",))
  want = shard_psum(lax.psum, mesh, "x", x)
  got = shard_psum(jax_llar.psum, mesh, "x", x)
  assert_bitwise(got, want)
  with np.errstate(invalid="ignore"):
    ref = testing.rank_order_sum(list(x), dtype).astype(np.float64)
  finite = np.isfinite(ref)
  for row in got.astype(np.float64):
    np.testing.assert_array_equal(np.isnan(row), np.isnan(ref))
    np.testing.assert_array_equal(row[np.isinf(ref)], ref[np.isinf(ref)])
    # Zeros and subnormals: lax.psum on CPU may flush subnormals to zero.
    assert np.all(np.abs(row[finite] - ref[finite]) <= 2 * tiny)


@pytest.mark.parametrize("dtype", ["int8", "uint32", "int64", "complex64",
                                   "float8_e4m3fn", "float8_e5m2"])
def test_other_dtypes_fall_back_like_lax(dtype):
  """F3: every other dtype is lax.psum's business, never a crash. The
  decision says "dtype" on CPU, as it would on GPUs (issue 15, item 3)."""
  dtype = np.dtype(getattr(ml_dtypes, dtype, None) or dtype)
  mesh = mesh_of((4,), ("x",))
  rng = np.random.default_rng(28)
  with jax.enable_x64(dtype == np.int64):
    if dtype.kind == "c":
      x = (rng.standard_normal((4, 6)) + 1j * rng.standard_normal((4, 6)))
      x = x.astype(dtype)
    elif dtype.kind in "iu":
      x = rng.integers(0 if dtype.kind == "u" else -30, 30, (4, 6)).astype(
          dtype)
    else:
      x = random_input(rng, (4, 6), dtype)
    want = shard_psum(lax.psum, mesh, "x", x)
    got = shard_psum(jax_llar.psum, mesh, "x", x)
  assert got.dtype == dtype
  assert np.array_equal(got.view(np.uint8), want.view(np.uint8))
  if dtype.kind in "iuc":
    np.testing.assert_allclose(got[0], x.sum(0, dtype=dtype), rtol=1e-6)
  assert {(d.reason, d.dtype, d.world_size, d.candidate)
          for d in jax_llar.dispatch_log()} == {("dtype", str(dtype), 4, None)}


def test_500_independent_psums_in_one_jit():
  """F4: 500 independent psums (different data each) in one program."""
  mesh = mesh_of((2,), ("x",))
  x = random_input(np.random.default_rng(5), (2, 500, 4), np.float32)
  spec = P("x")

  def make(fn):
    def body(v):
      return jnp.stack([fn(v[0, i], "x") for i in range(500)])[None]
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec,
                                 out_specs=spec))

  want = np.asarray(make(lax.psum)(x))
  got = np.asarray(make(jax_llar.psum)(x))
  assert_bitwise(got, want)
  check_against_reference(got, x, index_groups((2,), ("x",), "x"))
  # JAX lowers identical psums once (same avals and parameters).
  log = jax_llar.dispatch_log()
  assert log and {(d.reason, d.bytes_per_rank) for d in log} == {
      ("platform", 16)}


@hyp_settings(max_examples=30, deadline=None, database=None,
              derandomize=True)
@given(shape=st.lists(st.integers(0, 9), min_size=0, max_size=3).map(tuple),
       dtype=st.sampled_from(FLOAT_DTYPES),
       world=st.sampled_from([2, 4, 8]),
       seed=st.integers(0, 2**32 - 1))
def test_property_random_shapes(shape, dtype, world, seed):
  mesh = mesh_of((world,), ("x",))
  x = random_input(np.random.default_rng(seed), (world,) + shape, dtype)
  want = shard_psum(lax.psum, mesh, "x", x)
  got = shard_psum(jax_llar.psum, mesh, "x", x)
  assert_bitwise(got, want)
  check_against_reference(got, x, index_groups((world,), ("x",), "x"))


# --- typing (check_vma) ----------------------------------------------------------


def _trace_types(psum_fn, mesh, axes, in_spec, check_vma=True, value=None):
  """(vma, weak_type) of psum_fn's result, seen while tracing shard_map."""
  seen = []
  spec = P(tuple(mesh.axis_names))

  def body(v):
    r = psum_fn(v if value is None else value(v), axes)
    seen.append((jax.typeof(r).mat.varying, jax.typeof(r).weak_type))
    return r

  x = random_input(np.random.default_rng(6), (mesh.size, 3), np.float32)
  jax.make_jaxpr(jax.shard_map(body, mesh=mesh, in_specs=in_spec,
                               out_specs=spec, check_vma=check_vma))(x)
  (types,) = seen
  return types


@pytest.mark.parametrize("case", MESH_CASES, ids=CASE_IDS)
def test_vma_matches_lax(case):
  shape, names, axes = case
  mesh = mesh_of(shape, names)
  spec = P(tuple(names))
  want = _trace_types(lax.psum, mesh, axes, spec)
  got = _trace_types(jax_llar.psum, mesh, axes, spec)
  assert got == want
  assert got[0] == frozenset(names) - frozenset(axes_tuple(axes))
  # A weakly typed input keeps its weak type, as with lax.psum.
  def weak(v):
    del v
    return jnp.broadcast_to(lax.pcast(2.0, tuple(names), to="varying"), (3,))

  want = _trace_types(lax.psum, mesh, axes, spec, value=weak)
  got = _trace_types(jax_llar.psum, mesh, axes, spec, value=weak)
  assert got == want and got[1]


@pytest.mark.parametrize("case", MESH_CASES, ids=CASE_IDS)
def test_out_specs_replicated_works_exactly_when_lax_works(case):
  shape, names, axes = case
  mesh = mesh_of(shape, names)
  x = random_input(np.random.default_rng(7), (mesh.size, 3), np.float32)

  def run(fn):
    return np.asarray(jax.jit(jax.shard_map(
        lambda v: fn(v, axes), mesh=mesh, in_specs=P(tuple(names)),
        out_specs=P()))(x))

  (kind_lax, lax_out), (kind_llar, llar_out) = outcome(
      lambda: run(lax.psum)), outcome(lambda: run(jax_llar.psum))
  reduces_all = set(axes_tuple(axes)) == set(names)
  assert kind_lax == ("ok" if reduces_all else "raise")
  assert kind_llar == kind_lax, llar_out
  if kind_lax == "ok":
    assert_bitwise(llar_out, lax_out)
  else:
    assert type(llar_out) is type(lax_out)
    assert str(llar_out) == str(lax_out)


@pytest.mark.parametrize("auto_pcast", [True, False])
def test_psum_over_invariant_axis_like_lax(auto_pcast):
  """Value varying over 'a' only, psum over 'b': lax.psum inserts pvary
  (jax_auto_pcast, the default) and sums the replicas, or raises ValueError
  without auto_pcast. jax_llar must do the same."""
  mesh = mesh_of((2, 4), ("a", "b"))
  x = random_input(np.random.default_rng(8), (2, 3), np.float32)

  def run(fn):
    with jax_config.auto_pcast(auto_pcast):
      return np.asarray(jax.jit(jax.shard_map(
          lambda v: fn(v, "b"), mesh=mesh, in_specs=P("a"),
          out_specs=P("a")))(x))

  (kind_lax, lax_out), (kind_llar, llar_out) = outcome(
      lambda: run(lax.psum)), outcome(lambda: run(jax_llar.psum))
  assert kind_lax == ("ok" if auto_pcast else "raise")
  assert kind_llar == kind_lax, llar_out
  if auto_pcast:
    assert_bitwise(llar_out, lax_out)
    np.testing.assert_allclose(llar_out, 4 * x, rtol=1e-6)
    with jax_config.auto_pcast(True):
      assert (_trace_types(jax_llar.psum, mesh, "b", P("a"))
              == _trace_types(lax.psum, mesh, "b", P("a")))
  else:
    assert isinstance(lax_out, ValueError)
    assert isinstance(llar_out, ValueError)
    assert "variant->invariant" in str(llar_out)


_MIXED_BUG = (
    "jax_llar bug: psum over axes on which the value is partly varying and "
    "partly invariant is accepted (psum.py bind() pvarys the missing axes), "
    "while lax.psum raises ValueError (_get_from: axes must all be in one "
    "varying/invarying state)")


def test_psum_over_partly_invariant_axes_raises_like_lax():
  mesh = mesh_of((2, 4), ("a", "b"))
  x = random_input(np.random.default_rng(9), (2, 3), np.float32)

  def run(fn):
    return jax.jit(jax.shard_map(lambda v: fn(v, ("a", "b")), mesh=mesh,
                                 in_specs=P("a"), out_specs=P()))(x)

  with pytest.raises(ValueError, match="varying"):
    run(lax.psum)
  with pytest.raises(ValueError, match="varying"):
    run(jax_llar.psum)


@pytest.mark.parametrize("case", MESH_CASES, ids=CASE_IDS)
def test_check_vma_false(case):
  shape, names, axes = case
  mesh = mesh_of(shape, names)
  x = random_input(np.random.default_rng(10), (mesh.size, 4), np.float32)
  want = shard_psum(lax.psum, mesh, axes, x, check_vma=False)
  got = shard_psum(jax_llar.psum, mesh, axes, x, check_vma=False)
  assert_bitwise(got, want)
  check_against_reference(got, x, index_groups(shape, names, axes))
  spec = P(tuple(names))
  assert (_trace_types(jax_llar.psum, mesh, axes, spec, check_vma=False)
          == _trace_types(lax.psum, mesh, axes, spec, check_vma=False)
          == (frozenset(), False))


# --- transforms ------------------------------------------------------------------


@pytest.mark.parametrize("check_vma", [True, False])
@pytest.mark.parametrize("case", SOME_CASES, ids=SOME_IDS)
def test_grad_matches_lax(case, check_vma):
  shape, names, axes = case
  mesh = mesh_of(shape, names)
  spec = P(tuple(names))
  rng = np.random.default_rng(11)
  w = random_input(rng, (3,), np.float32)  # replicated parameter
  x = random_input(rng, (mesh.size, 3), np.float32)  # sharded data

  def loss(fn, w, x):
    def body(w, v):
      y = fn(jnp.sin(w * v[0]), axes)
      return (y * y + y * v[0])[None]
    out = jax.shard_map(body, mesh=mesh, in_specs=(P(), spec), out_specs=spec,
                        check_vma=check_vma)(w, x)
    return jnp.sum(out)

  grads = {fn: jax.jit(jax.grad(functools.partial(loss, fn), argnums=(0, 1)))(
      w, x) for fn in (lax.psum, jax_llar.psum)}
  for g, want in zip(grads[jax_llar.psum], grads[lax.psum]):
    assert_bitwise(np.asarray(g), np.asarray(want))
    assert np.all(np.isfinite(g)) and np.any(np.asarray(g) != 0)


@pytest.mark.parametrize("check_vma", [True, False])
def test_vmap_of_shard_map(check_vma):
  mesh = mesh_of((4,), ("x",))
  x = random_input(np.random.default_rng(12), (3, 4, 5), np.float32)

  def make(fn):
    return jax.jit(jax.vmap(jax.shard_map(
        lambda v: fn(v, "x"), mesh=mesh, in_specs=P("x"), out_specs=P(),
        check_vma=check_vma)))

  got = np.asarray(make(jax_llar.psum)(x))
  assert_bitwise(got, np.asarray(make(lax.psum)(x)))
  one = jax.jit(jax.shard_map(lambda v: jax_llar.psum(v, "x"), mesh=mesh,
                              in_specs=P("x"), out_specs=P(),
                              check_vma=check_vma))
  assert_bitwise(got, np.stack([np.asarray(one(b)) for b in x]))


# body(fn, v) for v the (1, 3, 5) block of one device; 'i' is vmapped.
VMAP_BODIES = {
    "mapped-i": lambda fn, v: jax.vmap(lambda w: fn(w, ("i",)),
                                       axis_name="i")(v[0]),
    "mapped-i-x": lambda fn, v: jax.vmap(lambda w: fn(w, ("i", "x")),
                                         axis_name="i")(v[0]),
    "unmapped-i": lambda fn, v: jax.vmap(lambda w: w * fn(v[0, 0], ("i",)),
                                         axis_name="i")(v[0]),
    "unmapped-i-x": lambda fn, v: jax.vmap(
        lambda w: w * fn(v[0, 0], ("i", "x")), axis_name="i")(v[0]),
    "mapped-x": lambda fn, v: jax.vmap(lambda w: fn(w, "x"),
                                       axis_name="i")(v[0]),
}


def _run_vmap_body(fn, name, check_vma):
  mesh = mesh_of((4,), ("x",))
  x = random_input(np.random.default_rng(13), (4, 3, 5), np.float32)
  body = VMAP_BODIES[name]
  return np.asarray(jax.jit(jax.shard_map(
      lambda v: body(fn, v)[None], mesh=mesh, in_specs=P("x"),
      out_specs=P("x"), check_vma=check_vma))(x)), x


@pytest.mark.parametrize("name", list(VMAP_BODIES))
def test_vmap_axis_name_inside_shard_map_no_check_vma(name):
  got, x = _run_vmap_body(jax_llar.psum, name, check_vma=False)
  want, _ = _run_vmap_body(lax.psum, name, check_vma=False)
  assert_bitwise(got, want)
  if name == "mapped-i":  # sum over the vmapped rows of each device
    np.testing.assert_allclose(got[:, 0], x.sum(1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["mapped-i", "unmapped-i", "mapped-x"])
def test_vmap_axis_name_inside_shard_map_check_vma(name):
  """With check_vma=True, lax.psum over a vmapped axis name inside shard_map
  fails in jax 0.11.2 (AssertionError in pvary); jax_llar must fail the same
  way. A psum over the mesh axis inside vmap works for both."""
  lax_kind, lax_out = outcome(lambda: _run_vmap_body(lax.psum, name, True))
  llar_kind, llar_out = outcome(
      lambda: _run_vmap_body(jax_llar.psum, name, True))
  assert llar_kind == lax_kind
  if name == "mapped-x":
    assert lax_kind == "ok"
    assert_bitwise(llar_out[0], lax_out[0])
  else:
    assert lax_kind == "raise"
    assert type(llar_out) is type(lax_out)


def test_vmap_axis_and_mesh_axis_check_vma_fails_like_lax():
  lax_kind, lax_out = outcome(
      lambda: _run_vmap_body(lax.psum, "mapped-i-x", True))
  llar_kind, llar_out = outcome(
      lambda: _run_vmap_body(jax_llar.psum, "mapped-i-x", True))
  assert lax_kind == llar_kind == "raise"
  assert isinstance(lax_out, ValueError)
  assert type(llar_out) is type(lax_out)


# --- control flow ----------------------------------------------------------------


def _scan(fn, c, v):
  def step(c, k):
    c = 0.5 * c + fn(jnp.sin(v * c + k), "x")
    return c, c[0]
  c, ys = lax.scan(step, c, jnp.arange(5, dtype=jnp.float32))
  return c + ys.sum()


def _fori(fn, c, v):
  return lax.fori_loop(0, 5, lambda i, c: 0.5 * c + fn(jnp.cos(v * c + i), "x"),
                       c)


def _cond(fn, c, v):
  # The predicate is replicated, so every rank takes the same branch.
  return lax.cond(c[0] > 0, lambda: fn(v * c, "x"),
                  lambda: fn(v - c, "x") * 2.0)


def _while(fn, c, v):
  # The loop condition reads the psum result itself.
  def body(s):
    i, c = s
    return i + 1, c + jnp.abs(fn(v * c, "x")) + 1.0
  return lax.while_loop(lambda s: (s[0] < 20) & (s[1][0] < 10.0), body,
                        (0, c))[1]


@pytest.mark.parametrize("check_vma", [True, False])
@pytest.mark.parametrize("loop", [_scan, _fori, _cond, _while],
                         ids=["scan", "fori_loop", "cond", "while_loop"])
def test_control_flow(loop, check_vma):
  mesh = mesh_of((4,), ("x",))
  rng = np.random.default_rng(14)
  c0 = random_input(rng, (3,), np.float32)  # replicated carry
  x = random_input(rng, (4, 3), np.float32)

  def make(fn):
    return jax.jit(jax.shard_map(
        lambda c, v: loop(fn, c, v[0]), mesh=mesh, in_specs=(P(), P("x")),
        out_specs=P(), check_vma=check_vma))

  got = np.asarray(make(jax_llar.psum)(c0, x))
  want = np.asarray(make(lax.psum)(c0, x))
  assert_bitwise(got, want)
  assert np.all(np.isfinite(got))
  assert any(d.reason == "platform" for d in jax_llar.dispatch_log())


# --- errors, axis_index_groups, positional axes ---------------------------------------


def test_outside_shard_map_raises_lax_name_error():
  """Unbound names raise lax.psum's NameError, with its message ("unbound
  axis name: x"), which JAX's own tests match."""
  x = random_input(np.random.default_rng(18), (3,), np.float32)
  for fn in (lax.psum, jax_llar.psum):
    for call in (lambda: fn(x, "x"), lambda: jax.jit(lambda y: fn(y, "x"))(x),
                 lambda: fn(2.0, "x")):
      with pytest.raises(NameError, match="unbound axis name: x"):
        call()


def test_unbound_axis_inside_shard_map_raises_like_lax():
  mesh = mesh_of((2,), ("x",))
  x = random_input(np.random.default_rng(19), (2, 3), np.float32)

  def run(fn):
    return jax.jit(jax.shard_map(lambda v: fn(v, "y"), mesh=mesh,
                                 in_specs=P("x"), out_specs=P()))(x)

  kind, lax_error = outcome(lambda: run(lax.psum))
  assert kind == "raise" and isinstance(lax_error, AssertionError)  # JAX's, bare
  kind, llar_error = outcome(lambda: run(jax_llar.psum))
  assert kind == "raise" and isinstance(llar_error, NameError), llar_error
  assert str(llar_error).startswith("unbound axis name: y (the axes bound here: 'x')")


def test_axis_index_groups_fall_back_to_lax(caplog):
  caplog.set_level(logging.INFO, logger="jax_llar")
  mesh = mesh_of((4,), ("x",))
  x = random_input(np.random.default_rng(20), (4, 3), np.float32)
  aig = [[0, 2], [1, 3]]

  def run(fn, check_vma):
    return np.asarray(jax.jit(jax.shard_map(
        lambda v: fn(v, "x", axis_index_groups=aig), mesh=mesh,
        in_specs=P("x"), out_specs=P("x"), check_vma=check_vma))(x))

  got, want = run(jax_llar.psum, False), run(lax.psum, False)
  assert_bitwise(got, want)
  check_against_reference(got, x, np.array(aig))
  assert any("axis_index_groups" in r.getMessage() for r in caplog.records
             if r.name == "jax_llar")
  # With check_vma, lax.psum does not serve axis_index_groups; neither may we.
  for fn in (lax.psum, jax_llar.psum):
    with pytest.raises(NotImplementedError):
      run(fn, True)


def test_axis_index_groups_fallback_in_dispatch_log():
  mesh = mesh_of((4,), ("x",))
  x = random_input(np.random.default_rng(21), (4, 3), np.float32)
  jax.jit(jax.shard_map(
      lambda v: jax_llar.psum(v, "x", axis_index_groups=[[0, 1], [2, 3]]),
      mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False))(x)
  assert [d.reason for d in jax_llar.dispatch_log()] == ["axis_index_groups"]
  (d,) = jax_llar.dispatch_log()
  assert (d.axes, d.dtype, d.bytes_per_rank, d.world_size) == (
      ("x",), "float32", 12, 2)
  assert (d.impl, d.algorithm, d.candidate) == ("lax.psum", None, None)


def test_positional_axes_like_lax():
  mesh = mesh_of((4,), ("x",))
  x = random_input(np.random.default_rng(22), (4, 3, 5), np.float32)

  def run(fn):
    return np.asarray(jax.jit(jax.shard_map(
        lambda v: fn(v[0], (0, "x")), mesh=mesh, in_specs=P("x"),
        out_specs=P(), check_vma=False))(x))

  got = run(jax_llar.psum)
  assert got.shape == (5,)
  assert_bitwise(got, run(lax.psum))
  np.testing.assert_allclose(got, x.sum((0, 1)), rtol=1e-5, atol=1e-5)
  (d,) = jax_llar.dispatch_log()
  assert (d.reason, d.axes, d.bytes_per_rank, d.world_size) == (
      "positional_axes", (0, "x"), 60, 4)


def test_an_unbound_axis_is_a_name_error_naming_it_and_the_bound_ones():
  """Inside shard_map lax.psum raises a bare AssertionError for an unknown
  axis; jax_llar.psum raises NameError with the name and the axes bound
  there, and outside any map the same NameError as lax.psum's."""
  mesh = mesh_of((2,), ("x",))
  for axes in ("nope", ("x", "nope")):
    f = jax.jit(jax.shard_map(lambda v, a=axes: jax_llar.psum(v, a), mesh=mesh,
                              in_specs=P("x"), out_specs=P("x")))
    with pytest.raises(NameError, match=r"unbound axis name: nope \(the axes bound here: 'x'\)"):
      f(jnp.ones(4))
  with pytest.raises(NameError, match=r"unbound axis name: x \(no axis is bound here"):
    jax_llar.psum(jnp.ones(2), "x")
  # Names bound by vmap count too, and integer axes are positional.
  got = jax.vmap(lambda v: jax_llar.psum(v, "i"), axis_name="i")(jnp.arange(3.0))
  assert np.array_equal(np.asarray(got), np.full(3, 3.0))
  assert float(jax_llar.psum(jnp.ones(2), 0)) == 2.0
