"""Reference results for tests and benchmarks (host, numpy).

The fast path promises: every rank's output equals a float64 sum of the ranks'
inputs, added in rank order starting from rank 0's value, rounded once (round
to nearest even) to the output dtype. `rank_order_sum` computes exactly that.
"""

from __future__ import annotations

from typing import Sequence

import ml_dtypes
import numpy as np


def round_from_f64(x: np.ndarray, dtype) -> np.ndarray:
  """Rounds float64 `x` once, to nearest even, to float32/bfloat16/float16.

  float32 and float16: numpy converts from float64 directly. bfloat16: numpy
  has no direct conversion, and float64 -> float32 -> bfloat16 could round
  twice; rounding to float32 with round-to-odd first (truncate, then set the
  last bit when inexact) makes the second rounding exact (the intermediate has
  more than two extra bits).
  """
  dtype = np.dtype(dtype)
  x = np.asarray(x, np.float64)
  if dtype != np.dtype(ml_dtypes.bfloat16):
    with np.errstate(over="ignore", invalid="ignore"):  # inf and NaN are values here
      return x.astype(dtype)
  with np.errstate(over="ignore", invalid="ignore"):
    f = x.astype(np.float32)
    inexact = np.isfinite(x) & (f.astype(np.float64) != x)
    # Truncate toward zero: step back one ulp where rounding went away from 0.
    away = inexact & (np.abs(f.astype(np.float64)) > np.abs(x))
    f = np.where(away, np.nextafter(f, np.float32(0)), f)
    bits = f.view(np.uint32) | inexact.astype(np.uint32)
  return bits.view(np.float32).astype(ml_dtypes.bfloat16)


def rank_order_sum(inputs: Sequence[np.ndarray], dtype) -> np.ndarray:
  """float64 sum of `inputs` in rank order (rank 0 first), rounded once; for
  int32 the exact sum modulo 2^32 (as XLA's int32 addition wraps)."""
  if np.dtype(dtype) == np.dtype(np.int32):
    acc = np.zeros(np.shape(inputs[0]), np.int64)
    for x in inputs:
      acc = acc + np.asarray(x).astype(np.int64)
    return (acc & 0xFFFFFFFF).astype(np.uint32).view(np.int32)
  with np.errstate(over="ignore", invalid="ignore"):  # inf + -inf is NaN, as on the GPU
    acc = np.asarray(inputs[0]).astype(np.float64)
    for x in inputs[1:]:
      acc = acc + np.asarray(x).astype(np.float64)
  return round_from_f64(acc, dtype)


def bitwise_equal(a: np.ndarray, b: np.ndarray) -> bool:
  """True when `a` and `b` have the same bits, NaNs compared by position only
  (a NaN's payload may be canonicalised by an addition)."""
  a = np.asarray(a)
  b = np.asarray(b)
  if a.shape != b.shape or a.dtype != b.dtype:
    return False
  if a.dtype.kind == "f" or a.dtype == np.dtype(ml_dtypes.bfloat16):
    fa = a.astype(np.float64)
    fb = b.astype(np.float64)
    nan_a, nan_b = np.isnan(fa), np.isnan(fb)
    if not np.array_equal(nan_a, nan_b):
      return False
    width = a.dtype.itemsize
    view = {2: np.uint16, 4: np.uint32, 8: np.uint64}[width]
    return bool(np.array_equal(a.view(view)[~nan_a], b.view(view)[~nan_b]))
  return bool(np.array_equal(a, b))


def random_array(rng: np.random.Generator, shape, dtype) -> np.ndarray:
  """Standard-normal data of `shape` in `dtype`, rounded through float32
  (never all zeros: the input rule of benchmarks/METHOD.md); for int32,
  integers over the whole range (sums wrap)."""
  if np.dtype(dtype) == np.dtype(np.int32):
    return rng.integers(-2**31, 2**31, size=shape, dtype=np.int64).astype(np.int32)
  return rng.standard_normal(shape).astype(np.float32).astype(dtype)
