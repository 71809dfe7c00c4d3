"""The two-shot LL128 all-reduce on real GPUs (over NVLink on the 2 x H200
machine), forced with settings.algorithm (JAX_LLAR_ALGORITHM=two_shot_ll128):
bitwise against the float64 rank-order reference at sizes around the
120-byte line, chunk counts not divisible by the number of ranks, several
steps per line slot, up to the 4 MiB limit, many calls in one program.

The tuning table does not dispatch to it (it waits for measurements on 2
GPUs and for the store-atomicity test over NVLink, python -m
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

TWO = algorithms.Algorithm.TWO_SHOT_LL128
LIMIT = algorithms.MAX_BYTES[TWO]


@pytest.fixture
def two_shot(monkeypatch):
  monkeypatch.setattr(config.settings, "algorithm", "two_shot_ll128")
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
  expect = testing.rank_order_sum(inputs, dtype)
  for r in range(len(inputs)):
    assert testing.bitwise_equal(out[r], out[0]), f"rank {r} differs from rank 0"
    assert testing.bitwise_equal(out[r], expect), (
        f"rank {r}: {np.flatnonzero(out[r].astype(np.float64) != expect.astype(np.float64))[:10]}")


def _took_two_shot(nbytes):
  return any(d.fast and d.algorithm is TWO and d.bytes_per_rank == nbytes
             for d in jax_llar.dispatch_log())


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_two_shot_ll128_random_values_all_sizes(mesh, dtype, two_shot):
  rng = np.random.default_rng(11)
  op = lambda v: jax_llar.psum(v, "x")  # a program of its own (not the one-shot's cache)
  for n in _counts(dtype, mesh.size):
    inputs = [testing.random_array(rng, (n,), dtype) for _ in range(mesh.size)]
    _check(mesh, inputs, dtype, op)
    assert _took_two_shot(n * dtype.itemsize), f"n={n}: two-shot not taken"


def test_two_shot_ll128_special_values(mesh, two_shot):
  dtype = np.dtype(np.float32)
  rng = np.random.default_rng(12)
  n = 300_001  # 1.2 MB: beyond the one-shot, odd
  specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 3.4e38],
                      dtype=dtype)
  inputs = []
  for _ in range(mesh.size):
    x = testing.random_array(rng, (n,), dtype)
    x[rng.integers(0, n, 64)] = rng.choice(specials, 64)
    inputs.append(x)
  _check(mesh, inputs, dtype, lambda v: jax_llar.psum(v, "x"))
  assert _took_two_shot(n * 4)


def test_two_shot_ll128_many_calls_in_one_program(mesh, two_shot):
  """Consecutive two-shot calls in one jit: the epoch parity and both
  regions reused without a barrier."""
  dtype = np.dtype(np.float32)
  n = 1 << 18  # 1 MiB

  inv = np.float32(1.0 / mesh.size)

  def op(v):
    def body(_, acc):
      return jax_llar.psum(acc, "x") * inv
    return jax.lax.fori_loop(0, 200, body, v)

  rng = np.random.default_rng(13)
  inputs = [np.round(testing.random_array(rng, (n,), dtype) * 8) / 8
            for _ in range(mesh.size)]
  out = allreduce_per_rank(mesh, inputs, op)
  for r in range(mesh.size):
    assert testing.bitwise_equal(out[r], out[0])
  assert _took_two_shot(n * 4)


def test_regions_follow_the_algorithms_lowered(mesh, two_shot):
  """A communicator set holds the region of every algorithm a lowering
  picked, and status() reports exactly their sum."""
  dtype = np.dtype(np.float32)
  rng = np.random.default_rng(7)
  inputs = [testing.random_array(rng, (1024,), dtype) for _ in range(mesh.size)]
  _check(mesh, inputs, dtype)
  assert _took_two_shot(1024 * 4)
  sets = jax_llar.status()["comm_sets"]
  held = [s for s in sets if "two_shot_ll" in s["regions"]]
  assert held, sets
  for s in held:
    world = s["world_size"]
    expect = sum(algorithms.region_bytes(algorithms.Algorithm.from_short_name(a), world)
                 for a in s["regions"])
    assert s["scratch_bytes_per_device"] == expect, s
