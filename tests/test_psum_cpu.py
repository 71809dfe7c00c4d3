"""CPU tests of jax_llar: on CPU, ``jax_llar.psum`` must be ``lax.psum``.

The fast path is CUDA-only, so on host devices every psum lowers like
``lax.psum``: values must be bitwise those of ``lax.psum``, the typing
(varying manual axes, ``out_specs``), autodiff, batching and control flow must
behave the same, and every lowering must be recorded as a fallback with reason
"platform". The CUDA lowering is checked as text (``lowering_platforms``), and
the dispatch policy through ``dispatch.decide`` with real CPU meshes and, for
the GPU-only branches, fake GPU devices.

Runs on 8 forced host devices (tests/conftest.py); meshes use 2, 4 or 8 of
them. Known bugs of jax_llar would be marked ``xfail(strict=True)`` with the
reason: the assertion states the correct behaviour, and the marker must go
when the bug is fixed.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings as hyp_settings, strategies as st
from jax import lax
from jax._src import config as jax_config
from jax._src.sharding_impls import ShardingContext, SPMDAxisContext
from jax.sharding import Mesh, PartitionSpec as P

import jax_llar
from jax_llar import _ext, _log, comm, dispatch, swap, testing
from jax_llar.config import settings as llar_settings

if (os.environ.get("JAX_LLAR_TEST_GPU") == "1"
    or jax.default_backend() != "cpu"):
  pytest.skip("CPU suite (the GPU suite is tests/test_gpu.py)",
              allow_module_level=True)
if len(jax.devices()) < 8:
  raise RuntimeError(f"the CPU suite needs 8 host devices, JAX has "
                     f"{len(jax.devices())}: see tests/conftest.py")

BF16 = np.dtype(ml_dtypes.bfloat16)
FLOAT_DTYPES = (np.dtype(np.float32), BF16, np.dtype(np.float16))
# Tolerance of lax.psum on CPU (its own order and accumulation) against the
# float64 rank-order reference; sums of at most 8 standard normals.
TOL = {np.dtype(np.float32): 1e-5, BF16: 6e-2, np.dtype(np.float16): 1e-2,
       np.dtype(np.float64): 1e-12}

# (mesh shape, axis names, psum axes)
MESH_CASES = [
    ((2,), ("x",), "x"),
    ((4,), ("x",), "x"),
    ((8,), ("x",), ("x",)),
    ((2, 2), ("a", "b"), "a"),
    ((2, 2), ("a", "b"), "b"),
    ((2, 2), ("a", "b"), ("a", "b")),
    ((2, 4), ("a", "b"), "a"),
    ((2, 4), ("a", "b"), "b"),
    ((2, 4), ("a", "b"), ("a", "b")),
    ((2, 4), ("a", "b"), ("b", "a")),
]


def _case_id(case) -> str:
  shape, _, axes = case
  axes = (axes,) if isinstance(axes, str) else axes
  return "x".join(map(str, shape)) + "-" + "".join(axes)


CASE_IDS = [_case_id(c) for c in MESH_CASES]
ONE_D = [c for c in MESH_CASES if len(c[0]) == 1]
ONE_D_IDS = [_case_id(c) for c in ONE_D]
SOME_CASES = [MESH_CASES[1], MESH_CASES[7], MESH_CASES[8]]
SOME_IDS = [_case_id(c) for c in SOME_CASES]


# --- helpers -------------------------------------------------------------------


@functools.cache
def mesh_of(shape: tuple, names: tuple) -> Mesh:
  n = math.prod(shape)
  return Mesh(np.array(jax.devices()[:n]).reshape(shape), names)


def _axes_tuple(axes) -> tuple:
  return (axes,) if isinstance(axes, str) else tuple(axes)


def index_groups(shape, names, axes) -> np.ndarray:
  """Rows: the flat device indices that reduce together (mesh axis order)."""
  axes = _axes_tuple(axes)
  idx = np.arange(math.prod(shape)).reshape(shape)
  keep = [i for i, n in enumerate(names) if n not in axes]
  red = [i for i, n in enumerate(names) if n in axes]
  gsize = math.prod(shape[i] for i in red)
  return idx.transpose(keep + red).reshape(-1, gsize)


def shard_psum(psum_fn, mesh, axes, x, *, check_vma=True):
  """Runs ``psum_fn(x[i], axes)`` on device i of `mesh` (flat order).

  `x` is an array (or pytree of arrays) whose leading dimension is the mesh
  size; the result has the same layout: row i is device i's output.
  """
  spec = P(tuple(mesh.axis_names))

  def body(v):
    out = psum_fn(jax.tree.map(lambda a: a[0], v), axes)
    return jax.tree.map(lambda r: r[None], out)

  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec,
                            check_vma=check_vma))
  return jax.tree.map(np.asarray, f(x))


def random_input(rng, shape, dtype) -> np.ndarray:
  dtype = np.dtype(dtype)
  if dtype == np.bool_:
    return rng.random(shape) < 0.5
  if dtype.kind in "iu":
    return rng.integers(-1000, 1000, size=shape).astype(dtype)
  if dtype == np.float64:
    return rng.standard_normal(shape)
  return testing.random_array(rng, shape, dtype)


def assert_bitwise(got, want):
  got, want = np.asarray(got), np.asarray(want)
  assert got.dtype == want.dtype, (got.dtype, want.dtype)
  assert got.shape == want.shape, (got.shape, want.shape)
  assert testing.bitwise_equal(got, want), f"\n{got}\n!=\n{want}"


def check_against_reference(out, x, groups):
  """`out` rows of one group are bitwise identical and equal the sum of that
  group's inputs: exactly for integers and bools (counted as int32 like
  lax.psum), within TOL of the float64 rank-order sum for floats."""
  in_dtype = x.dtype
  for g in groups:
    for i in g[1:]:
      assert_bitwise(out[i], out[g[0]])
    if in_dtype == np.bool_:
      assert out.dtype == np.int32
      np.testing.assert_array_equal(out[g[0]], x[g].sum(0, dtype=np.int32))
    elif in_dtype.kind in "iu":
      assert out.dtype == in_dtype
      np.testing.assert_array_equal(out[g[0]], x[g].sum(0, dtype=in_dtype))
    else:
      assert out.dtype == in_dtype
      if in_dtype == np.float64:
        ref = np.sum(x[g], axis=0)
      else:
        ref = testing.rank_order_sum(list(x[g]), in_dtype)
      tol = TOL[in_dtype]
      np.testing.assert_allclose(out[g[0]].astype(np.float64),
                                 ref.astype(np.float64), rtol=tol, atol=tol)


def x64_if(dtype):
  return (jax.enable_x64(True) if np.dtype(dtype) == np.float64
          else contextlib.nullcontext())


def outcome(fn):
  """('ok', value) or ('raise', exception) of calling fn()."""
  try:
    return "ok", fn()
  except Exception as e:  # pylint: disable=broad-except
    return "raise", e


@pytest.fixture(autouse=True)
def _fresh_dispatch_log():
  jax_llar.clear_dispatch_log()
  yield


@pytest.fixture
def restore_lax_psum():
  """Puts lax.psum back if a test (of a swap bug) left it swapped."""
  yield
  if jax.lax.psum is not swap._original or swap._depth:  # pylint: disable=protected-access
    swap._depth = 0  # pylint: disable=protected-access
    jax.lax.psum = swap._original  # pylint: disable=protected-access


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
  """F3: every other dtype is lax.psum's business, never a crash."""
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
  assert {(d.reason, d.dtype) for d in jax_llar.dispatch_log()} == {
      ("platform", str(dtype))}


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
  assert got[0] == frozenset(names) - frozenset(_axes_tuple(axes))
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
  reduces_all = set(_axes_tuple(axes)) == set(names)
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


# --- dispatch log and decisions ---------------------------------------------------


def test_cpu_lowering_logs_platform_fallback(caplog):
  caplog.set_level(logging.INFO, logger="jax_llar")
  mesh = mesh_of((2, 4), ("a", "b"))
  x = random_input(np.random.default_rng(15), (8, 6), BF16)
  shard_psum(jax_llar.psum, mesh, "b", x)
  shard_psum(jax_llar.psum, mesh, "b", x * 2)  # same program, new lambda
  log = jax_llar.dispatch_log()
  assert len(log) == 2
  for d in log:
    assert d.impl == "lax.psum" and d.reason == "platform" and not d.fast
    assert d.axes == ("b",) and d.dtype == "bfloat16"
    assert d.bytes_per_rank == 6 * 2 and d.comm_id == 0
  msgs = [r.getMessage() for r in caplog.records if r.name == "jax_llar"]
  assert len([m for m in msgs if "CUDA-only" in m]) == 1, msgs
  jax_llar.clear_dispatch_log()
  assert jax_llar.dispatch_log() == []
  shard_psum(jax_llar.psum, mesh, "b", x)
  msgs = [r.getMessage() for r in caplog.records if r.name == "jax_llar"]
  assert len([m for m in msgs if "CUDA-only" in m]) == 2, msgs
  assert [d.reason for d in jax_llar.dispatch_log()] == ["platform"]


def _ctx(shape=(2, 4), names=("a", "b")):
  return SPMDAxisContext(mesh_of(shape, names))


def _aval(shape, dtype=np.float32):
  return jax.core.ShapedArray(shape, np.dtype(dtype))


class _FakeGpu:
  platform = "gpu"
  process_index = 0

  def __init__(self, i):
    self.local_hardware_id = i


@pytest.fixture
def fake_gpus(monkeypatch):
  """decide() sees groups of GPUs, a loaded extension and a communicator."""
  calls = []

  def groups(axis_ctx, axes):
    return [[_FakeGpu(4 * g + r) for r in range(4)] for g in range(2)]

  def get_or_create(groups):
    calls.append(groups)
    return comm.CommSet(comm_id=5, key=1234, groups=tuple(map(tuple, groups)),
                        world_size=len(groups[0]), scratch_bytes=1 << 20)

  monkeypatch.setattr(dispatch, "replica_groups", groups)
  monkeypatch.setattr(_ext, "load", lambda: object())
  monkeypatch.setattr(comm, "get_or_create", get_or_create)
  return calls


def test_decide_reasons_and_order(monkeypatch):
  ctx, axes = _ctx(), ("b",)
  # disabled is checked first, even for an unsupported dtype.
  monkeypatch.setattr(llar_settings, "disabled", True)
  d = dispatch.decide(ctx, _aval((4,), np.int32), axes)
  assert (d.impl, d.reason) == ("lax.psum", "disabled")
  monkeypatch.setattr(llar_settings, "disabled", False)
  # dtype before empty; empty before the mesh.
  assert dispatch.decide(ctx, _aval((0,), np.int32), axes).reason == "dtype"
  for dt in (np.int32, np.bool_, np.float64, np.int8, np.complex64,
             ml_dtypes.float8_e4m3fn):
    assert dispatch.decide(ctx, _aval((4,), dt), axes).reason == "dtype"
  for dt in (np.float32, BF16, np.float16):
    assert dispatch.decide(None, _aval((3, 0), dt), axes).reason == "empty"
  # no SPMD axis context, or an abstract mesh: "mesh".
  assert dispatch.decide(None, _aval((4,)), axes).reason == "mesh"
  assert dispatch.decide(ShardingContext(2), _aval((4,)), axes).reason == "mesh"
  # a group of one device.
  d = dispatch.decide(_ctx((1, 2)), _aval((4,)), ("a",))
  assert (d.reason, d.world_size) == ("world_size", 1)
  # CPU devices: "platform", with the right world size and payload.
  for axes, world in ((("a",), 2), (("b",), 4), (("a", "b"), 8)):
    d = dispatch.decide(ctx, _aval((5, 3), BF16), axes)
    assert (d.impl, d.reason, d.world_size) == ("lax.psum", "platform", world)
    assert (d.axes, d.dtype, d.bytes_per_rank) == (axes, "bfloat16", 30)
  # several processes.
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  assert dispatch.decide(ctx, _aval((4,)), ("b",)).reason == "multiprocess"


def test_decide_size_threshold(monkeypatch):
  ctx, axes = _ctx(), ("b",)
  limit = llar_settings.max_bytes
  assert limit == 256 * 1024
  at = dispatch.decide(ctx, _aval((limit // 4,)), axes)
  above = dispatch.decide(ctx, _aval((limit // 4 + 1,)), axes)
  assert (at.reason, above.reason) == ("platform", "size")
  assert above.bytes_per_rank == limit + 4 and above.world_size == 4
  monkeypatch.setattr(llar_settings, "max_bytes", 1000)
  assert dispatch.decide(ctx, _aval((500,), BF16), axes).reason == "platform"
  assert dispatch.decide(ctx, _aval((501,), BF16), axes).reason == "size"
  assert dispatch.decide(ctx, _aval((251,)), axes).reason == "size"


def test_decide_gpu_branches(monkeypatch, fake_gpus):
  ctx, axes = _ctx(), ("b",)
  limit = llar_settings.max_bytes
  d = dispatch.decide(ctx, _aval((limit // 2,), np.float16), axes)
  assert (d.impl, d.reason, d.comm_id, d.comm_key, d.world_size) == (
      "llar.one_shot_ll", "fast_path", 5, 1234, 4)
  assert d.fast and dispatch.algorithm_id(d) == 1
  assert fake_gpus == [[[0, 1, 2, 3], [4, 5, 6, 7]]]
  assert dispatch.decide(ctx, _aval((limit // 2 + 1,), np.float16),
                         axes).reason == "size"
  with pytest.raises(ValueError):
    dispatch.algorithm_id(dispatch.decide(ctx, _aval((4,), np.int32), axes))
  # more ranks than the kernels serve.
  monkeypatch.setattr(dispatch, "replica_groups",
                      lambda c, a: [[_FakeGpu(i) for i in range(17)]])
  d = dispatch.decide(ctx, _aval((4,)), axes)
  assert (d.reason, d.world_size) == ("world_size", 17)
  monkeypatch.setattr(dispatch, "replica_groups",
                      lambda c, a: [[_FakeGpu(0), _FakeGpu(1)]])
  # communicator creation fails.

  def refuse(groups):
    raise comm.CommError("not peers")
  monkeypatch.setattr(comm, "get_or_create", refuse)
  d = dispatch.decide(ctx, _aval((4,)), axes)
  assert (d.reason, d.detail) == ("communicator", "not peers")
  # extension not loaded.
  monkeypatch.setattr(_ext, "load", lambda: None)
  assert dispatch.decide(ctx, _aval((4,)), axes).reason == "extension"


def test_each_fallback_reason_logged_once(caplog, monkeypatch):
  caplog.set_level(logging.DEBUG, logger="jax_llar")
  ctx, axes = _ctx(), ("b",)
  big = llar_settings.max_bytes // 4 + 1

  def all_reasons():
    monkeypatch.setattr(llar_settings, "disabled", True)
    out = [dispatch.decide(ctx, _aval((4,)), axes)]
    monkeypatch.setattr(llar_settings, "disabled", False)
    out += [dispatch.decide(ctx, _aval((4,), np.int32), axes),
            dispatch.decide(ctx, _aval((0,)), axes),
            dispatch.decide(None, _aval((4,)), axes),
            dispatch.decide(_ctx((1, 2)), _aval((4,)), ("a",)),
            dispatch.decide(ctx, _aval((big,)), axes),
            dispatch.decide(ctx, _aval((4,)), axes)]
    return [d.reason for d in out]

  reasons = ["disabled", "dtype", "empty", "mesh", "world_size", "size",
             "platform"]
  for _ in range(3):
    assert all_reasons() == reasons
  records = [r for r in caplog.records if r.name == "jax_llar"]
  assert len(records) == len(reasons), [r.getMessage() for r in records]
  log = jax_llar.dispatch_log()
  assert [d.reason for d in log] == reasons * 3
  for r, d in zip(records, log):
    assert d.detail in r.getMessage() and str(d.axes) in r.getMessage()
  jax_llar.clear_dispatch_log()
  assert jax_llar.dispatch_log() == []
  assert all_reasons() == reasons
  records = [r for r in caplog.records if r.name == "jax_llar"]
  assert len(records) == 2 * len(reasons)


def test_replica_groups_follow_jax_layout():
  for shape, names, axes in MESH_CASES:
    mesh = mesh_of(shape, names)
    flat = list(mesh.devices.flat)
    groups = dispatch.replica_groups(SPMDAxisContext(mesh), _axes_tuple(axes))
    got = sorted(sorted(flat.index(d) for d in g) for g in groups)
    want = sorted(sorted(g) for g in index_groups(shape, names, axes).tolist())
    assert got == want, (shape, axes)


# --- CUDA lowering (as text, on CPU) -------------------------------------------------


def _cuda_text(fn, x, mesh, platforms=("cuda",)):
  f = jax.jit(jax.shard_map(lambda v: fn(v, "x"), mesh=mesh, in_specs=P("x"),
                            out_specs=P()))
  return f.trace(x).lower(lowering_platforms=platforms).as_text()


def test_cuda_lowering_emits_ffi_call(monkeypatch):
  mesh = mesh_of((2,), ("x",))
  x = random_input(np.random.default_rng(16), (2, 8), np.float32)
  seen = []

  def fast(axis_ctx, aval, axes):
    seen.append((type(axis_ctx), aval.shape, axes))
    return _log.Decision("llar.one_shot_ll", "fast_path", "", tuple(axes),
                         "float32", 32, 2, 7, 4242)

  monkeypatch.setattr(dispatch, "decide", fast)
  text = _cuda_text(jax_llar.psum, x, mesh)
  assert "custom_call @jax_llar_all_reduce" in text
  assert "comm_id = 7" in text and "algorithm = 1" in text
  assert "comm_key = 4242" in text
  assert "all_reduce\"" not in text
  assert seen == [(SPMDAxisContext, (1, 8), ("x",))]
  # Lowered for CUDA and CPU together: the CPU branch keeps lax.psum.
  text = _cuda_text(jax_llar.psum, x, mesh, ("cuda", "cpu"))
  assert "custom_call @jax_llar_all_reduce" in text
  assert "stablehlo.all_reduce" in text


def test_cuda_lowering_on_cpu_devices_falls_back():
  mesh = mesh_of((2,), ("x",))
  x = random_input(np.random.default_rng(17), (2, 8), np.float32)
  text = _cuda_text(jax_llar.psum, x, mesh)
  assert "jax_llar_all_reduce" not in text
  assert "stablehlo.all_reduce" in text
  # The fallback lowers exactly like lax.psum.
  assert text == _cuda_text(lax.psum, x, mesh)
  log = jax_llar.dispatch_log()
  assert [(d.impl, d.reason, d.world_size) for d in log] == [
      ("lax.psum", "platform", 2)]
  text = _cuda_text(jax_llar.psum, x.astype(np.int32), mesh)
  assert "jax_llar_all_reduce" not in text and "stablehlo.all_reduce" in text
  assert jax_llar.dispatch_log()[-1].reason == "dtype"


# --- errors, axis_index_groups, positional axes ---------------------------------------


def test_outside_shard_map_raises_name_error():
  x = random_input(np.random.default_rng(18), (3,), np.float32)
  for call in (lambda: jax_llar.psum(x, "x"),
               lambda: jax.jit(lambda y: jax_llar.psum(y, "x"))(x),
               lambda: jax_llar.llar_psum_p.bind(x, axes=("x",),
                                                 check_vma=False)):
    with pytest.raises(NameError, match="shard_map"):
      call()
  with pytest.raises(NameError):
    lax.psum(x, "x")


def test_unbound_axis_inside_shard_map_raises_name_error():
  """lax.psum fails too (a bare AssertionError from its pvary in jax
  0.11.2); jax_llar names the unbound axis."""
  mesh = mesh_of((2,), ("x",))
  x = random_input(np.random.default_rng(19), (2, 3), np.float32)

  def run(fn):
    return jax.jit(jax.shard_map(lambda v: fn(v, "y"), mesh=mesh,
                                 in_specs=P("x"), out_specs=P()))(x)

  assert outcome(lambda: run(lax.psum))[0] == "raise"
  with pytest.raises(NameError, match="'y'.*shard_map"):
    run(jax_llar.psum)


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


# --- swap_psum ---------------------------------------------------------------------


def _psum_jaxpr_text(x, mesh):
  return str(jax.make_jaxpr(jax.shard_map(
      lambda v: jax.lax.psum(v, "x"), mesh=mesh, in_specs=P("x"),
      out_specs=P()))(x))


def test_swap_psum_context_and_decorator(restore_lax_psum):
  mesh = mesh_of((2,), ("x",))
  x = random_input(np.random.default_rng(23), (2, 3), np.float32)
  original = jax.lax.psum
  assert original is not jax_llar.psum
  with jax_llar.swap_psum():
    assert jax.lax.psum is jax_llar.psum
    text = _psum_jaxpr_text(x, mesh)
    with jax_llar.swap_psum():  # nesting two instances keeps the swap
      pass
    assert jax.lax.psum is jax_llar.psum
  assert "llar_psum" in text and "psum_invariant" not in text
  assert jax.lax.psum is original
  text = _psum_jaxpr_text(x, mesh)
  assert "llar_psum" not in text and "psum_invariant" in text

  @jax_llar.swap_psum()
  def traced(v):
    return _psum_jaxpr_text(v, mesh)

  assert "llar_psum" in traced(x)
  assert jax.lax.psum is original
  with pytest.raises(ZeroDivisionError):
    with jax_llar.swap_psum():
      _ = 1 / 0
  assert jax.lax.psum is original


def test_swap_psum_traced_inside_compiled_outside(restore_lax_psum):
  """The documented pattern: jit outside, the swap around the traced code."""
  mesh = mesh_of((2,), ("x",))
  x = random_input(np.random.default_rng(24), (2, 3), np.float32)

  @jax.jit
  @jax_llar.swap_psum()
  def step(v):
    return jax.shard_map(lambda w: jax.lax.psum(w, "x"), mesh=mesh,
                         in_specs=P("x"), out_specs=P())(v)

  got = np.asarray(step(x))
  assert_bitwise(got, shard_psum(lax.psum, mesh, "x", x)[0:1])
  assert [d.reason for d in jax_llar.dispatch_log()] == ["platform"]


_SWAP_RECURSION = (
    "jax_llar bug: under swap_psum, jax_llar.psum's own fallbacks call "
    "lax.psum by attribute (psum.py: lax.psum for constants, bools, "
    "axis_index_groups, and _lax_psum_lowering), which is jax_llar.psum "
    "while swapped: RecursionError")


@pytest.mark.parametrize("what", ["compile-inside", "constant", "bool"])
def test_swap_psum_fallbacks_inside_swap(what, restore_lax_psum):
  mesh = mesh_of((2,), ("x",))
  x = random_input(np.random.default_rng(25), (2, 3), np.float32)
  body = {"compile-inside": lambda v: jax.lax.psum(v, "x"),
          "constant": lambda v: jax.lax.psum(1, "x") * v,
          "bool": lambda v: jax.lax.psum(v > 0, "x")}[what]
  f = lambda: np.asarray(jax.jit(jax.shard_map(  # pylint: disable=g-long-lambda
      body, mesh=mesh, in_specs=P("x"), out_specs=P(
          "x" if what == "constant" else None)))(x))
  want = f()
  with jax_llar.swap_psum():
    got = f()
  assert_bitwise(got, want)


def test_swap_psum_same_instance_reentered(restore_lax_psum):
  s = jax_llar.swap_psum()
  with s:
    with s:
      assert jax.lax.psum is jax_llar.psum
    assert jax.lax.psum is jax_llar.psum
  assert jax.lax.psum is swap._original  # pylint: disable=protected-access


# --- status ----------------------------------------------------------------------


def test_status_inactive_on_cpu():
  s = jax_llar.status()
  assert s["active"] is False
  assert isinstance(s["reason"], str) and s["reason"]
  assert s["comm_sets"] == [] and s["nccl_runtime"] is None
  assert s["settings"]["max_bytes"] == llar_settings.max_bytes
  assert jax_llar.error_reports() == []


# --- jax_llar.testing ---------------------------------------------------------------


def _all_finite_bf16() -> tuple[np.ndarray, np.ndarray]:
  """Every finite bfloat16 value (as float64, sorted, -0 dropped) and bits."""
  bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
  with np.errstate(invalid="ignore"):  # signalling NaNs
    vals = bits.view(BF16).astype(np.float64)
  keep = np.isfinite(vals) & ~((vals == 0) & np.signbit(vals))
  order = np.argsort(vals[keep], kind="stable")
  return vals[keep][order], bits[keep][order]


def test_round_from_f64_bfloat16_is_nearest_ties_to_even():
  table, bits = _all_finite_bf16()
  rng = np.random.default_rng(26)
  # Random values over the whole exponent range, including subnormals.
  mant = rng.uniform(1, 2, 4000) * rng.choice([-1, 1], 4000)
  x = np.ldexp(mant, rng.integers(-134, 127, 4000))
  # Exact midpoints between neighbours, and one float64 ulp either side of
  # them (where rounding via float32 could go wrong twice).
  i = rng.integers(0, len(table) - 1, 2000)
  mid = (table[i] + table[i + 1]) / 2
  x = np.concatenate([x, mid, np.nextafter(mid, np.inf),
                      np.nextafter(mid, -np.inf)])
  got = testing.round_from_f64(x, BF16)
  assert got.dtype == BF16
  hi = np.clip(np.searchsorted(table, x), 1, len(table) - 1)
  lo = hi - 1
  d_lo, d_hi = np.abs(x - table[lo]), np.abs(table[hi] - x)
  even_hi = (bits[hi] & 1) == 0
  pick = np.where((d_hi < d_lo) | ((d_hi == d_lo) & even_hi), hi, lo)
  np.testing.assert_array_equal(got.astype(np.float64), table[pick])
  assert np.sum(d_hi == d_lo) >= 1000  # the ties were really ties
  # Signed zeros, infinities and NaN.
  special = testing.round_from_f64(
      np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-50, -1e-50]), BF16)
  assert list(special.view(np.uint16)[:4]) == [0x0000, 0x8000, 0x7F80, 0xFF80]
  assert np.isnan(special[4].astype(np.float64))
  assert list(special.view(np.uint16)[5:]) == [0x0000, 0x8000]


def test_round_from_f64_float32_float16_match_numpy():
  x = np.random.default_rng(27).standard_normal(1000) * 100
  for dt in (np.float32, np.float16):
    assert testing.bitwise_equal(testing.round_from_f64(x, dt), x.astype(dt))


def test_rank_order_sum_rounds_once():
  a = [np.array([2.0**24], np.float32), np.array([1.0], np.float32),
       np.array([1.0], np.float32)]
  # float32 step by step would give 2**24; one rounding gives 2**24 + 2.
  assert testing.rank_order_sum(a, np.float32)[0] == 2.0**24 + 2
  b = [np.array([1.0], BF16), np.array([2.0**-8], BF16),
       np.array([2.0**-9], BF16)]
  # 1 + 2**-8 + 2**-9 rounds up to 1 + 2**-7 in bfloat16 (a bfloat16 running
  # sum would tie 1 + 2**-8 down to 1 first).
  assert testing.rank_order_sum(b, BF16).astype(np.float64)[0] == 1 + 2.0**-7


def test_bitwise_equal():
  f = np.array([1.0, np.nan, -0.0], np.float32)
  g = f.copy()
  g.view(np.uint32)[1] = 0x7FC00123  # another NaN payload, same position
  assert testing.bitwise_equal(f, g)
  assert not testing.bitwise_equal(f, np.array([1.0, 2.0, -0.0], np.float32))
  assert not testing.bitwise_equal(f, np.array([np.nan, 1.0, -0.0],
                                               np.float32))
  assert not testing.bitwise_equal(f, np.array([1.0, np.nan, 0.0], np.float32))
  assert not testing.bitwise_equal(f, f.astype(np.float64))
  assert not testing.bitwise_equal(f, f[:2])
  h = np.array([-0.0, np.nan, 3.0], BF16)
  assert testing.bitwise_equal(h, np.array([-0.0, np.nan, 3.0], BF16))
  assert not testing.bitwise_equal(h, np.array([0.0, np.nan, 3.0], BF16))
  assert testing.bitwise_equal(np.array([1, 2], np.int32),
                               np.array([1, 2], np.int32))
  assert not testing.bitwise_equal(np.array([1, 2], np.int32),
                                   np.array([1, 3], np.int32))
