"""The two-shot LL128 atomic all-reduce on real GPUs (over NVLink on the
2 x H200 machine), forced with settings.algorithm
(JAX_LLAR_ALGORITHM=two_shot_ll128_atomic): its rule, not bitwise equality
(it is not deterministic; ffi/src/kernels/two_shot_ll128_atomic.cuh): every
rank gets the same bits, int32 is bitwise the reference, every float element
is within jax_llar.testing.atomic_sum_violations's bound of the exact sum;
at sizes around the 120-byte line, chunk counts not divisible by the number
of ranks, several steps per line slot, up to the 4 MiB limit, many calls in
one program.

No tuning table may choose it (jax_llar.algorithms.NON_DETERMINISTIC): every
test here forces it and raises max_bytes to its limit. Its all-gather rests
on 128-byte stores arriving whole (the store-atomicity test across the GPUs,
python -m jax_llar.tools.store_atomicity --writer_device 0
--reader_device 1, comes first); its reduce-scatter on .sys-scope atomics
and a release fence.
"""

from __future__ import annotations

import numpy as np
import pytest

import jax
import jax_llar
from jax_llar import algorithms, config, testing

from gpu_helpers import ALL_DTYPES, allreduce_per_rank

ATOMIC = algorithms.Algorithm.TWO_SHOT_LL128_ATOMIC
LIMIT = algorithms.MAX_BYTES[ATOMIC]


@pytest.fixture
def atomic(monkeypatch):
  monkeypatch.setattr(config.settings, "algorithm", "two_shot_ll128_atomic")
  monkeypatch.setattr(config.settings, "max_bytes", config.MAX_BYTES_CAP)
  jax_llar.clear_dispatch_log()


def _counts(dtype, world):
  """Element counts: tiny (fewer lines than ranks), odd (tails), one element
  either side of multiples of the 120-byte line, chunk counts not divisible
  by `world`, several steps per line slot, the limit."""
  per_line = 120 // dtype.itemsize
  lines = [1, 2, 3, world - 1, world + 1, 8 * world + 1, 4096 * world + 3,
           2 * 4096 * world + 5, LIMIT // 120]
  counts = {1, 3, 7, 1023, 4097, LIMIT // dtype.itemsize}
  for ln in lines:
    for d in (-1, 0, 1):
      c = ln * per_line + d
      if 0 < c * dtype.itemsize <= LIMIT:
        counts.add(c)
  return sorted(counts)


def _check(mesh, inputs, dtype, op=None):
  out = allreduce_per_rank(mesh, inputs, op)
  u = {2: np.uint16, 4: np.uint32}[np.dtype(dtype).itemsize]
  for r in range(len(inputs)):
    assert np.array_equal(out[r].view(u), out[0].view(u)), f"rank {r} differs from rank 0"
  bad = testing.atomic_sum_violations(out[0], inputs, dtype)
  assert not bad.any(), f"elements off the rule: {np.flatnonzero(bad)[:10]}"
  if np.dtype(dtype) == np.dtype(np.int32):
    assert testing.bitwise_equal(out[0], testing.rank_order_sum(inputs, dtype))
  return out


def _took_atomic(nbytes):
  return any(d.fast and d.algorithm is ATOMIC and d.bytes_per_rank == nbytes
             for d in jax_llar.dispatch_log())


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_two_shot_ll128_atomic_random_values_all_sizes(mesh, dtype, atomic):
  rng = np.random.default_rng(21)
  op = lambda v: jax_llar.psum(v, "x")  # a program of its own
  for n in _counts(dtype, mesh.size):
    inputs = [testing.random_array(rng, (n,), dtype) for _ in range(mesh.size)]
    _check(mesh, inputs, dtype, op)
    assert _took_atomic(n * dtype.itemsize), f"n={n}: the atomic two-shot not taken"


def test_two_shot_ll128_atomic_special_values(mesh, atomic):
  dtype = np.dtype(np.float32)
  rng = np.random.default_rng(22)
  n = 300_001  # 1.2 MB: several chunks, odd
  specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 3.4e38],
                      dtype=dtype)
  inputs = []
  for _ in range(mesh.size):
    x = testing.random_array(rng, (n,), dtype)
    x[rng.integers(0, n, 64)] = rng.choice(specials, 64)
    inputs.append(x)
  out = _check(mesh, inputs, dtype, lambda v: jax_llar.psum(v, "x"))
  nan = np.isnan(out[0])
  assert (out[0].view(np.uint32)[nan] == 0x7FFFFFFF).all()  # the canonical NaN
  assert _took_atomic(n * 4)


def test_two_shot_ll128_atomic_many_calls_in_one_program(mesh, atomic):
  """Consecutive calls in one jit (both accumulator halves and the
  all-gather regions reused without a barrier): every rank the same bits,
  and, on values whose sums are exact in float32 (multiples of 1/8 far from
  the precision limit, times 1/world each step), exactly the reference."""
  dtype = np.dtype(np.float32)
  n = 1 << 18  # 1 MiB
  inv = np.float32(1.0 / mesh.size)

  def op(v):
    def body(_, acc):
      return jax_llar.psum(acc, "x") * inv
    return jax.lax.fori_loop(0, 200, body, v)

  rng = np.random.default_rng(23)
  inputs = [np.round(testing.random_array(rng, (n,), dtype) * 8) / 8
            for _ in range(mesh.size)]
  out = allreduce_per_rank(mesh, inputs, op)
  for r in range(mesh.size):
    assert np.array_equal(out[r].view(np.uint32), out[0].view(np.uint32))
  if mesh.size & (mesh.size - 1) == 0:  # 1/world exact: every step exact
    x = testing.rank_order_sum(inputs, dtype) * inv
    for _ in range(199):
      x = testing.rank_order_sum([x] * mesh.size, dtype) * inv
    assert testing.bitwise_equal(out[0], x)
  assert _took_atomic(n * 4)


def test_shipped_tables_never_choose_it(mesh, monkeypatch):
  """Without forcing, no psum of any size lowers to it."""
  monkeypatch.setattr(config.settings, "max_bytes", config.MAX_BYTES_CAP)
  jax_llar.clear_dispatch_log()
  rng = np.random.default_rng(24)
  for n in (1, 1024, 65536, 1 << 20):
    inputs = [testing.random_array(rng, (n,), np.float32) for _ in range(mesh.size)]
    allreduce_per_rank(mesh, inputs, lambda v: jax_llar.psum(v, "x"))
  assert jax_llar.dispatch_log()
  assert all(d.algorithm is not ATOMIC for d in jax_llar.dispatch_log())
