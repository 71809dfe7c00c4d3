"""The one-shot LL128 all-reduce on real GPUs (over NVLink on the 2 x H200
machine), forced with settings.algorithm (JAX_LLAR_ALGORITHM=one_shot_ll128):
bitwise against the float64 rank-order reference and bitwise the one-shot
LL's output at sizes around the 120-byte line, odd sizes, up to the LL128's
limit, many calls in one program.

The tuning table does not dispatch to the LL128 (it waits for measurements
on 2 GPUs, and for the store-atomicity test over NVLink: python -m
jax_llar.tools.store_atomicity --writer_device 0 --reader_device 1): every
test here forces it and raises max_bytes to its limit.
"""

from __future__ import annotations

import numpy as np
import pytest

import jax
import jax_llar
from jax_llar import algorithms, config, testing

from gpu_helpers import ALL_DTYPES, allreduce_per_rank

LL128 = algorithms.Algorithm.ONE_SHOT_LL128
LIMIT = algorithms.MAX_BYTES[LL128]
LL_LIMIT = algorithms.MAX_BYTES[algorithms.Algorithm.ONE_SHOT_LL]


@pytest.fixture
def ll128(monkeypatch):
  monkeypatch.setattr(config.settings, "algorithm", "one_shot_ll128")
  monkeypatch.setattr(config.settings, "max_bytes", config.MAX_BYTES_CAP)
  jax_llar.clear_dispatch_log()


def _counts(dtype):
  """Element counts: one element, odd counts, one element either side of a
  multiple of the 120-byte line (one line, a warp's 4, a block's 64, the
  grid's last), and the limit."""
  per_line = 120 // dtype.itemsize
  counts = {1, 3, 7, 1023, 4097, LIMIT // dtype.itemsize}
  for lines in (1, 4, 5, 64, 65, 513, 4095, LIMIT // 120):
    for d in (-1, 0, 1):
      c = lines * per_line + d
      if 0 < c * dtype.itemsize <= LIMIT:
        counts.add(c)
  return sorted(counts)


def _check(mesh, inputs, dtype, op):
  out = allreduce_per_rank(mesh, inputs, op)
  expect = testing.rank_order_sum(inputs, dtype)
  for r in range(len(inputs)):
    assert testing.bitwise_equal(out[r], out[0]), f"rank {r} differs from rank 0"
    assert testing.bitwise_equal(out[r], expect), (
        f"rank {r}: {np.flatnonzero(out[r].astype(np.float64) != expect.astype(np.float64))[:10]}")
  return out


def _took_ll128(nbytes):
  return any(d.fast and d.algorithm is LL128 and d.bytes_per_rank == nbytes
             for d in jax_llar.dispatch_log())


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_ll128_random_values_all_sizes(mesh, dtype, ll128):
  rng = np.random.default_rng(21)
  op = lambda v: jax_llar.psum(v, "x")  # a program of its own (not the one-shot's cache)
  for n in _counts(dtype):
    inputs = [testing.random_array(rng, (n,), dtype) for _ in range(mesh.size)]
    _check(mesh, inputs, dtype, op)
    assert _took_ll128(n * dtype.itemsize), f"n={n}: LL128 not taken"


def test_ll128_equals_the_one_shot_ll(mesh, ll128, monkeypatch):
  """Same inputs through both algorithms: the same bits (special values
  included; NaNs by position), at sizes both serve."""
  dtype = np.dtype(np.float32)
  rng = np.random.default_rng(22)
  specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 3.4e38],
                      dtype=dtype)
  for n in (30, 31, 29, 4097, LL_LIMIT // 4):
    inputs = []
    for _ in range(mesh.size):
      x = testing.random_array(rng, (n,), dtype)
      x[rng.integers(0, n, min(n, 16))] = rng.choice(specials, min(n, 16))
      inputs.append(x)
    got = _check(mesh, inputs, dtype, lambda v: jax_llar.psum(v, "x"))
    assert _took_ll128(n * 4)
    monkeypatch.setattr(config.settings, "algorithm", "one_shot_ll")
    ll = allreduce_per_rank(mesh, inputs, lambda v: jax_llar.psum(v, "x"))
    monkeypatch.setattr(config.settings, "algorithm", "one_shot_ll128")
    # NaNs by position: a sum of NaN payloads keeps the payload of the
    # operand each compiled addition puts first (benchmarks/NOTES.md).
    assert testing.bitwise_equal(got, ll), f"n={n}"


def test_ll128_many_calls_in_one_program(mesh, ll128):
  """Consecutive LL128 calls in one jit: the epoch parity reused without a
  barrier, across more calls than one half of the scratch."""
  dtype = np.dtype(np.float32)
  n = 120 * 64 * 10 // 4  # 640 lines

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
    assert testing.bitwise_equal(out[r], out[0])
  assert _took_ll128(n * 4)
