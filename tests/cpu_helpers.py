"""Helpers shared by the CPU test files (not a test file itself).

Meshes of 2, 4 or 8 of the 8 forced host devices (tests/conftest.py), the
mesh cases the psum tests sweep, a runner of ``psum_fn`` inside a jitted
``shard_map``, random inputs, and the float64 rank-order reference check.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os

import jax
import ml_dtypes
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

from jax_llar import testing

if jax.default_backend() != "cpu" or len(jax.devices()) < 8:
  raise RuntimeError(
      f"the CPU suite needs 8 host devices, JAX has {len(jax.devices())} "
      f"{jax.default_backend()} devices: see tests/conftest.py (run the GPU "
      "suite with JAX_LLAR_TEST_GPU=1)")

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


def case_id(case) -> str:
  shape, _, axes = case
  axes = (axes,) if isinstance(axes, str) else axes
  return "x".join(map(str, shape)) + "-" + "".join(axes)


CASE_IDS = [case_id(c) for c in MESH_CASES]
ONE_D = [c for c in MESH_CASES if len(c[0]) == 1]
ONE_D_IDS = [case_id(c) for c in ONE_D]
SOME_CASES = [MESH_CASES[1], MESH_CASES[7], MESH_CASES[8]]
SOME_IDS = [case_id(c) for c in SOME_CASES]


@functools.cache
def mesh_of(shape: tuple, names: tuple) -> Mesh:
  n = math.prod(shape)
  return Mesh(np.array(jax.devices()[:n]).reshape(shape), names)


def axes_tuple(axes) -> tuple:
  return (axes,) if isinstance(axes, str) else tuple(axes)


def index_groups(shape, names, axes) -> np.ndarray:
  """Rows: the flat device indices that reduce together (mesh axis order)."""
  axes = axes_tuple(axes)
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


def user_env() -> dict:
  """This process's environment without the test suite's forced devices: what
  a user's shell would pass to a tool run as a subprocess."""
  env = dict(os.environ)
  env.pop("JAX_PLATFORMS", None)
  flags = [f for f in env.get("XLA_FLAGS", "").split()
           if "xla_force_host_platform_device_count" not in f]
  env["XLA_FLAGS"] = " ".join(flags)
  return env
