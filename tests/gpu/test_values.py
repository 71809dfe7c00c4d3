"""Values on the fast path: every size, dtype and special value, bitwise
against the float64 rank-order reference (F1, F2, F4, F9)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_llar
from jax_llar import testing

from gpu_helpers import (ALL_DTYPES, BF16, DTYPES, F32, allreduce_per_rank, check_allreduce, fast,
                         took_fast_path)


def _counts(dtype):
  """Element counts: odd sizes (F2), every warp and block-count boundary of
  the grid rule (64 lines per block up to 64 blocks, then up to 512), and the
  one-shot limit."""
  per_line = 8 // dtype.itemsize
  lines = [1, 2, 3, 7, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257,
           511, 512, 513, 1023, 4095, 4096, 4097,
           16384 - 1, 16384, 16384 + 1, 32768]
  counts = {1, 2, 3, 7, 17, 1023, 4097}
  for ln in lines:
    for d in (-1, 0, 1):
      c = ln * per_line + d
      if 0 < c * dtype.itemsize <= 256 * 1024:
        counts.add(c)
  return sorted(counts)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_f2_random_values_all_sizes(mesh, dtype):
  rng = np.random.default_rng(1)
  for n in _counts(dtype):
    inputs = [testing.random_array(rng, (n,), dtype) for _ in range(mesh.size)]
    assert check_allreduce(mesh, inputs, dtype), f"n={n}: fast path not taken"


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_f2_above_limit_falls_back(mesh, dtype):
  n = 256 * 1024 // dtype.itemsize + 8 // dtype.itemsize
  rng = np.random.default_rng(2)
  inputs = [testing.random_array(rng, (n,), dtype) for _ in range(mesh.size)]
  jax_llar.clear_dispatch_log()
  out = allreduce_per_rank(mesh, inputs)
  d = jax_llar.dispatch_log()
  assert d and all(x.reason == "size" for x in d), d
  assert not took_fast_path(inputs[0].nbytes, dtype)
  np.testing.assert_allclose(out[0].astype(np.float64),
                             testing.rank_order_sum(inputs, dtype).astype(np.float64),
                             rtol=1e-2 if dtype != F32 else 1e-6)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_f1_special_values(mesh, dtype):
  """-0.0, +0.0, subnormals, NaN payloads, +-inf: the LL flag never collides."""
  finfo = ml_dtypes.finfo(dtype)
  sub = float(finfo.smallest_subnormal)
  specials = np.array([-0.0, 0.0, sub, -sub, 3 * sub, np.inf, -np.inf, np.nan,
                       float(finfo.max), -float(finfo.max), 1.0, -1.0], np.float64)
  n = 4096 // dtype.itemsize
  rng = np.random.default_rng(3)
  inputs = []
  for _ in range(mesh.size):
    v = specials[rng.integers(0, len(specials), n)].astype(dtype)
    if dtype == F32:  # distinct NaN payloads
      bits = v.view(np.uint32)
      nan = np.isnan(v)
      bits[nan] = 0x7FC00000 | rng.integers(1, 1 << 22, nan.sum()).astype(np.uint32)
    inputs.append(v)
  for r in range(mesh.size):  # -0 + -0 = -0
    inputs[r][:8] = np.array([-0.0] * 8).astype(dtype)
  assert check_allreduce(mesh, inputs, dtype)
  zeros = [np.zeros(n, dtype) for _ in range(mesh.size)]
  check_allreduce(mesh, zeros, dtype)


def test_f4_ten_thousand_calls_in_one_program(mesh):
  """10,000 consecutive psums in one jitted program (lax.fori_loop), exact."""
  n = 1024
  steps = 10_000
  rng = np.random.default_rng(4)
  inputs = [testing.random_array(rng, (n,), F32) for _ in range(mesh.size)]

  def body(v):
    delta = (lax.axis_index("x") + 1).astype(jnp.float32) * jnp.float32(2.0 ** -10)
    return lax.fori_loop(0, steps, lambda i, v: jax_llar.psum(v, "x") * 0.5 + delta, v)

  jax_llar.clear_dispatch_log()
  out = allreduce_per_rank(mesh, inputs, op=body)
  assert fast(jax_llar.dispatch_log())
  xs = [x.copy() for x in inputs]
  deltas = [np.float32((r + 1) * 2.0 ** -10) for r in range(mesh.size)]
  for _ in range(steps):
    s = testing.rank_order_sum(xs, F32)
    xs = [s * np.float32(0.5) + deltas[r] for r in range(mesh.size)]
  for r in range(mesh.size):
    assert testing.bitwise_equal(out[r], xs[r]), f"rank {r}"


def test_f4_many_independent_psums_in_one_jit(mesh):
  """500 independent psums in one program (one epoch each, many grids)."""
  rng = np.random.default_rng(5)
  sizes = [int(s) for s in rng.integers(1, 3000, 500)]
  inputs = [[testing.random_array(rng, (s,), F32) for s in sizes] for _ in range(mesh.size)]

  def body(*vs):
    return tuple(jax_llar.psum(v, "x") for v in vs)

  xs = [jax.device_put(np.stack([inputs[r][i] for r in range(mesh.size)]),
                       NamedSharding(mesh, P("x"))) for i in range(len(sizes))]
  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                            check_vma=False))
  outs = f(*xs)
  for i, o in enumerate(outs):
    o = np.asarray(o)
    expect = testing.rank_order_sum([inputs[r][i] for r in range(mesh.size)], F32)
    for r in range(mesh.size):
      assert testing.bitwise_equal(o[r], expect), f"psum {i} rank {r}"


def test_f9_determinism_across_sizes(mesh):
  """Identical rows in tensors of different sizes give identical results."""
  rng = np.random.default_rng(9)
  row = [testing.random_array(rng, (128,), BF16) for _ in range(mesh.size)]
  results = []
  for reps in (1, 3, 64, 600, 1024):  # 256 B .. 256 KiB per rank
    inputs = [np.tile(r, reps) for r in row]
    out = allreduce_per_rank(mesh, inputs)
    results.append(out[:, :128])
    for k in range(reps):
      assert testing.bitwise_equal(out[0, k * 128:(k + 1) * 128], results[0][0])
  for res in results:
    assert testing.bitwise_equal(res, results[0])
