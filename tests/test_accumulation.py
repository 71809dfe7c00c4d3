"""The float accumulation of the two-rank kernel equals the float64 reference.

For a world size of 2 the one-shot kernel adds the two ranks' values in float
and rounds once to the dtype (ffi/include/llar/reduce.cuh); for larger groups it
accumulates in float64. The GPU suite compares the kernel with
`testing.rank_order_sum` (float64 in rank order, rounded once); this file checks
the arithmetic claim behind the two-rank path on the CPU, where numpy's float32
addition and conversions round to nearest even like the kernel's
`__fadd_rn`, `__float2bfloat16_rn` and `__float2half_rn`:

  round_dtype(float(a) + float(b)) == round_dtype(double(a) + double(b))

for float32, bfloat16 and float16, including subnormals, infinities, the
largest finite values and sums that land exactly halfway between two values.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings as hyp_settings, strategies as st

from jax_llar import testing

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = (np.dtype(np.float32), BF16, np.dtype(np.float16))
_UINT = {2: np.uint16, 4: np.uint32}


def float_path(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """What the two-rank kernel computes: a float sum rounded once to the dtype."""
  with np.errstate(over="ignore", invalid="ignore"):
    s = a.astype(np.float32) + b.astype(np.float32)
    return s.astype(a.dtype)


def reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  return testing.rank_order_sum([a, b], a.dtype)


def assert_same(a: np.ndarray, b: np.ndarray) -> None:
  got, want = float_path(a, b), reference(a, b)
  u = _UINT[a.dtype.itemsize]
  nan = np.isnan(got.astype(np.float64))
  bad = (got.view(u) != want.view(u)) & ~(nan & np.isnan(want.astype(np.float64)))
  bad |= nan != np.isnan(want.astype(np.float64))
  i = np.flatnonzero(bad)[:5]
  assert not bad.any(), (f"{a.dtype}: a={a[i]} b={b[i]} float path={got[i]} "
                         f"reference={want[i]}")


def random_bits(rng, n: int, dtype) -> np.ndarray:
  """Uniform random bit patterns: every exponent, subnormals, inf and NaN."""
  u = _UINT[dtype.itemsize]
  return rng.integers(0, np.iinfo(u).max, n, dtype=u, endpoint=True).view(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_random_bit_patterns(dtype):
  rng = np.random.default_rng(11)
  n = 1 << 21
  assert_same(random_bits(rng, n, dtype), random_bits(rng, n, dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_near_exponents_and_halfway_sums(dtype):
  """Second operands 0 to 2 * (p + 2) binades below the first, random mantissa,
  random signs. Rounding twice can only go wrong where the float sum is
  inexact, i.e. about q - p binades apart (16 for bf16, 13 for f16, 29 for
  float32 in float64), with the exact sum near a halfway point of the dtype:
  this range covers those cases densely."""
  rng = np.random.default_rng(12)
  n = 1 << 21
  u = _UINT[dtype.itemsize]
  bits = 8 * dtype.itemsize
  mant = {np.dtype(np.float32): 23, BF16: 7, np.dtype(np.float16): 10}[dtype]
  top = np.int64(1) << (bits - 1)
  largest = np.int64(np.array(ml_dtypes.finfo(dtype).max, dtype).view(u))
  mag_a = rng.integers(0, largest + 1, n)  # finite magnitudes, as bit patterns
  below = rng.integers(0, 2 * (mant + 3), n)  # binades below a
  mag_b = mag_a - (below << mant) + rng.integers(0, 1 << mant, n)
  mag_b = np.clip(mag_b, 0, largest)
  sign_a = rng.integers(0, 2, n) * top
  sign_b = rng.integers(0, 2, n) * top
  a = (mag_a | sign_a).astype(u).view(dtype)
  b_ = (mag_b | sign_b).astype(u).view(dtype)
  assert_same(a, b_)


@pytest.mark.parametrize("dtype", (BF16, np.dtype(np.float16)), ids=str)
def test_every_16_bit_value_against_a_sample(dtype):
  """Every bf16 / f16 value plus each of 48 random values and a set of specials."""
  rng = np.random.default_rng(13)
  every = np.arange(1 << 16, dtype=np.uint16).view(dtype)
  finfo = ml_dtypes.finfo(dtype)
  specials = np.array([0.0, -0.0, float(finfo.smallest_subnormal),
                       -float(finfo.smallest_subnormal), float(finfo.tiny),
                       float(finfo.max), -float(finfo.max), 1.0, np.inf, -np.inf],
                      np.float64).astype(dtype)
  others = np.concatenate([specials, random_bits(rng, 48, dtype)])
  for b in others:
    assert_same(every, np.full_like(every, b))


@hyp_settings(max_examples=300, deadline=None)
@given(st.floats(width=32, allow_nan=False), st.floats(width=32, allow_nan=False))
def test_float32_pairs(x, y):
  a = np.array([x], np.float32)
  b = np.array([y], np.float32)
  assert_same(a, b)
