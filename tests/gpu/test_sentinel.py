"""The one-shot sentinel all-reduce on real GPUs, forced with
settings.algorithm (JAX_LLAR_ALGORITHM=one_shot_sentinel): bitwise against the
float64 rank-order reference at sizes up to its 512 KiB limit, bitwise against
the one-shot LL on special values (NaN bits too at 2 ranks; at more, every
NaN the canonical one), many calls in one program, int32 refused (lax.psum
serves it) and its region reported.

The tuning table does not dispatch to the sentinel yet (it waits for
measurements on 2 GPUs): every test here forces it and raises max_bytes to
the cap.
"""

from __future__ import annotations

import jax
import ml_dtypes
import numpy as np
import pytest

import jax_llar
from jax_llar import algorithms, config, testing

from gpu_helpers import DTYPES, I32, allreduce_per_rank

SENT = algorithms.Algorithm.ONE_SHOT_SENTINEL
LIMIT = algorithms.MAX_BYTES[SENT]
UINT = {2: np.uint16, 4: np.uint32}


@pytest.fixture
def sentinel(monkeypatch):
  monkeypatch.setattr(config.settings, "algorithm", "one_shot_sentinel")
  monkeypatch.setattr(config.settings, "max_bytes", config.MAX_BYTES_CAP)
  jax_llar.clear_dispatch_log()


def _counts(dtype):
  """Element counts: one element, odd tails, a 16-byte line and around it,
  block and grid boundaries, the one-shot LL's limit and the sentinel's."""
  per_line = 16 // dtype.itemsize
  counts = {1, 3, 7, 1023, 4097}
  for lines in (1, 2, 63, 64, 65, 64 * 64, 64 * 64 + 1, 16384, 32768):
    for d in (-1, 0, 1):
      c = lines * per_line + d
      if 0 < c * dtype.itemsize <= LIMIT:
        counts.add(c)
  return sorted(counts)


def _took_sentinel(nbytes):
  return any(d.fast and d.algorithm is SENT and d.bytes_per_rank == nbytes
             for d in jax_llar.dispatch_log())


def _check(mesh, inputs, dtype, op=None):
  out = allreduce_per_rank(mesh, inputs, op)
  expect = testing.rank_order_sum(inputs, dtype)
  for r in range(len(inputs)):
    assert testing.bitwise_equal(out[r], out[0]), f"rank {r} differs from rank 0"
    assert testing.bitwise_equal(out[r], expect), (
        f"rank {r}: {np.flatnonzero(out[r].astype(np.float64) != expect.astype(np.float64))[:10]}")
  return out


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_sentinel_random_values_all_sizes(mesh, dtype, sentinel):
  rng = np.random.default_rng(21)
  op = lambda v: jax_llar.psum(v, "x")  # a program of its own
  for n in _counts(dtype):
    inputs = [testing.random_array(rng, (n,), dtype) for _ in range(mesh.size)]
    _check(mesh, inputs, dtype, op)
    assert _took_sentinel(n * dtype.itemsize), f"n={n}: sentinel not taken"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_sentinel_equals_the_one_shot_ll_bit_for_bit(mesh, dtype, monkeypatch):
  """Every NaN pattern of the 16-bit dtypes (a sample of float32's), the
  all-ones words the sender replaces, -0.0, subnormals and inf: every
  element that is not NaN has the one-shot LL's bits, NaNs are at the same
  places and are the canonical NaN (ffi/include/llar/sentinel.cuh, NaN
  results); at 2 ranks every bit is the one-shot LL's."""
  rng = np.random.default_rng(22)
  from jax_llar.tools import loopback_harness as lh  # pylint: disable=g-import-not-at-top
  per_line = 16 // dtype.itemsize
  lines = lh.nan_pattern_lines(rng, mesh.size, dtype)
  n = lines.shape[0] * per_line + 5  # and a tail
  base = np.stack([testing.random_array(rng, (n,), dtype) for _ in range(mesh.size)])
  x = lh.special_set(rng, lh.nan_pattern_set(rng, base))
  inputs = list(x)
  monkeypatch.setattr(config.settings, "max_bytes", config.MAX_BYTES_CAP)
  outs = {}
  for name in ("one_shot_ll", "one_shot_sentinel"):
    monkeypatch.setattr(config.settings, "algorithm", name)
    jax_llar.clear_dispatch_log()
    outs[name] = _check(mesh, inputs, dtype, lambda v: jax_llar.psum(v, "x"))
    assert any(d.fast and d.algorithm.short_name == name for d in jax_llar.dispatch_log())
  u = UINT[dtype.itemsize]
  a, b = outs["one_shot_ll"].view(u), outs["one_shot_sentinel"].view(u)
  nan = lh._nan(outs["one_shot_sentinel"])
  assert np.array_equal(nan, lh._nan(outs["one_shot_ll"]))
  assert np.array_equal(a[~nan], b[~nan]), np.argwhere((a != b) & ~nan)[:5]
  assert lh.non_canonical_nans(outs["one_shot_sentinel"]) == 0 and nan.any()
  if mesh.size == 2:  # the one-shot LL's NaN is the canonical one too
    assert np.array_equal(a, b), np.argwhere(a != b)[:5]


def test_sentinel_refuses_int32(mesh, sentinel):
  """int32 forced onto the sentinel goes to lax.psum, with the reason."""
  rng = np.random.default_rng(23)
  inputs = [testing.random_array(rng, (1000,), I32) for _ in range(mesh.size)]
  _check(mesh, inputs, I32)
  decisions = [d for d in jax_llar.dispatch_log() if d.bytes_per_rank == 4000]
  assert decisions and not any(d.fast for d in decisions)
  assert any(d.reason == "dtype" and "int32" in d.detail for d in decisions)


def test_sentinel_many_calls_in_one_program(mesh, sentinel):
  """200 consecutive calls in one jit: parity and re-arming without a barrier."""
  dtype = np.dtype(ml_dtypes.bfloat16)
  n = 1 << 17  # 256 KiB
  inv = np.float32(1.0 / mesh.size)

  def op(v):
    def body(_, acc):
      return (jax_llar.psum(acc, "x").astype(np.float32) * inv).astype(dtype)
    return jax.lax.fori_loop(0, 200, body, v)

  rng = np.random.default_rng(24)
  inputs = [np.round(testing.random_array(rng, (n,), dtype) * 8) / 8
            for _ in range(mesh.size)]
  out = allreduce_per_rank(mesh, inputs, op)
  for r in range(mesh.size):
    assert testing.bitwise_equal(out[r], out[0])
  assert _took_sentinel(n * 2)


def test_sentinel_region_is_reported(mesh, sentinel):
  dtype = np.dtype(np.float32)
  rng = np.random.default_rng(25)
  _check(mesh, [testing.random_array(rng, (1024,), dtype) for _ in range(mesh.size)], dtype)
  assert _took_sentinel(4096)
  held = [s for s in jax_llar.status()["comm_sets"] if "one_shot_sentinel" in s["regions"]]
  assert held
  for s in held:
    expect = sum(algorithms.region_bytes(algorithms.Algorithm.from_short_name(a),
                                         s["world_size"]) for a in s["regions"])
    assert s["scratch_bytes_per_device"] == expect, s
