"""jax_llar.testing: the host references the tests and benchmarks trust.

``round_from_f64`` (one rounding from float64, nearest even, also for
bfloat16 which numpy cannot convert to directly), ``rank_order_sum`` (the fast
path's contract: float64 in rank order, rounded once), ``bitwise_equal`` and
``random_array``.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from jax_llar import testing

BF16 = np.dtype(ml_dtypes.bfloat16)


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


def test_bitwise_equal_with_canonical_nans():
  """canonical_nans: every NaN of the output under test must have the
  canonical bits (reduce.cuh); the reference's NaN bits do not matter."""
  for dt, canonical, other in ((np.float32, 0x7FFFFFFF, 0x7FC00000),
                               (BF16, 0x7FFF, 0x7FC0), (np.float16, 0x7FFF, 0x7E00)):
    u = {2: np.uint16, 4: np.uint32}[np.dtype(dt).itemsize]
    out = np.array([1.0, np.nan, -0.0], dt)
    out.view(u)[1] = canonical
    ref = np.array([1.0, np.nan, -0.0], dt)
    ref.view(u)[1] = other
    assert testing.bitwise_equal(out, ref, canonical_nans=True), dt
    bad = out.copy()
    bad.view(u)[1] = other
    assert testing.bitwise_equal(bad, ref)
    assert not testing.bitwise_equal(bad, ref, canonical_nans=True), dt
  ints = np.array([-1, 7], np.int32)
  assert testing.bitwise_equal(ints, ints.copy(), canonical_nans=True)


def test_random_array():
  rng = np.random.default_rng(29)
  for dt in (np.float32, BF16, np.float16):
    a = testing.random_array(rng, (3, 1000), dt)
    assert a.shape == (3, 1000) and a.dtype == np.dtype(dt)
    assert np.all(np.isfinite(a.astype(np.float64))) and np.count_nonzero(a) > 2900
    # Standard normal: mean near 0, standard deviation near 1.
    assert abs(float(a.astype(np.float64).mean())) < 0.1
    assert 0.9 < float(a.astype(np.float64).std()) < 1.1
  a = testing.random_array(np.random.default_rng(5), (8,), np.float32)
  b = testing.random_array(np.random.default_rng(5), (8,), np.float32)
  assert testing.bitwise_equal(a, b)  # a seed gives the same data


def test_rank_order_sum_int32_wraps_like_xla():
  a = np.array([2**31 - 1, -2**31, 5, -7], np.int32)
  b = np.array([1, -1, 2**31 - 1, 3], np.int32)
  got = testing.rank_order_sum([a, b, b], np.int32)
  want = (a.astype(np.int64) + 2 * b.astype(np.int64)).astype(np.uint64) & 0xFFFFFFFF
  assert got.dtype == np.int32
  np.testing.assert_array_equal(got.view(np.uint32), want.astype(np.uint32))
  x = testing.random_array(np.random.default_rng(0), (1000,), np.int32)
  assert x.dtype == np.int32 and x.min() < -2**30 and x.max() > 2**30


def test_random_array_draws_rows_as_consecutive_calls():
  """One draw of a shape holds what consecutive draws of its rows give
  (loopback_harness.make_inputs draws all sets and ranks at once)."""
  for dt in (np.float32, BF16, np.float16, np.int32):
    whole = testing.random_array(np.random.default_rng(8), (3, 2, 17), dt)
    rng = np.random.default_rng(8)
    rows = np.stack([testing.random_array(rng, (2, 17), dt) for _ in range(3)])
    assert testing.bitwise_equal(whole, rows), dt
