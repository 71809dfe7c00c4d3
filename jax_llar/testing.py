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


# The NaN bits every jax_llar algorithm stores for a NaN result
# (ffi/include/llar/reduce.cuh: kCanonicalNaN32, kCanonicalNaN16).
CANONICAL_NAN_BITS = {np.dtype(np.float32): 0x7FFFFFFF,
                      np.dtype(ml_dtypes.bfloat16): 0x7FFF, np.dtype(np.float16): 0x7FFF}


def bitwise_equal(a: np.ndarray, b: np.ndarray, canonical_nans: bool = False) -> bool:
  """True when `a` and `b` have the same bits, NaNs compared by position only
  (the reference's NaN payloads are numpy's, not the GPU's).

  Args:
    a, b: arrays of one shape and dtype.
    canonical_nans: also require every NaN of `a` (the output under test) to
      have the bits of CANONICAL_NAN_BITS, the rule of every jax_llar
      algorithm (lax.psum's NaNs are NCCL's: do not ask it of them).

  Example::

    >>> bitwise_equal(np.float32([1.0, np.nan]), np.float32([1.0, -np.nan]))
    True
  """
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
    if canonical_nans and a.dtype in CANONICAL_NAN_BITS:
      if not np.all(a.view(view)[nan_a] == CANONICAL_NAN_BITS[a.dtype]):
        return False
    return bool(np.array_equal(a.view(view)[~nan_a], b.view(view)[~nan_b]))
  return bool(np.array_equal(a, b))


def random_array(rng: np.random.Generator, shape, dtype) -> np.ndarray:
  """Standard-normal data of `shape` in `dtype`, drawn in float32 and
  rounded once to `dtype` (never all zeros: the input rule of
  benchmarks/METHOD.md); for int32, integers over the whole range (sums
  wrap). One call of a shape draws what consecutive calls of its rows would
  (the generator's stream, in C order)."""
  if np.dtype(dtype) == np.dtype(np.int32):
    return rng.integers(-2**31, 2**31, size=shape, dtype=np.int32)
  x = rng.standard_normal(shape, dtype=np.float32)
  return x if np.dtype(dtype) == np.dtype(np.float32) else x.astype(dtype)


# --- the rule of a non-deterministic (atomic) sum -----------------------------------

# Unit roundoff of the float32 accumulator of an atomic sum, and float32's
# smallest normal: red.add.f32 on global memory flushes subnormal inputs and
# results to zero (PTX ISA, red), each flush moving the sum by less than it.
_U_F32 = 2.0 ** -24
_F32_SMALLEST_NORMAL = 2.0 ** -126
_F32_MAX = float(np.finfo(np.float32).max)
# Unit roundoff of the output dtypes (rounding to nearest even).
_UNIT_ROUNDOFF = {np.dtype(np.float32): 2.0 ** -24,
                  np.dtype(ml_dtypes.bfloat16): 2.0 ** -8,
                  np.dtype(np.float16): 2.0 ** -11}


def atomic_sum_bound(inputs: Sequence[np.ndarray], dtype) -> tuple[np.ndarray, np.ndarray,
                                                                    np.ndarray]:
  """The exact sum, the error bound and where overflow is possible, for an
  all-reduce whose float sum is accumulated by atomic additions in any order.

  The rule (ffi/src/kernels/two_shot_ll128_atomic.cuh, the atomic variant of
  arXiv 2607.16100, section 4): the world = len(inputs) addends x_i of an
  element are summed in float32, starting from +0.0, in an arbitrary order,
  with a rounding to nearest after each of the world - 1 additions that
  follow the first, and red.add.f32's flushing of subnormal inputs and
  results to zero; float32 output is that sum, bfloat16 and float16 output
  is it rounded once to the dtype. With S = sum |x_i| and E = sum x_i over
  the finite addends (float64: exact up to world * 2^-53 * S, added to the
  bound), gamma = (world - 1) u / (1 - (world - 1) u) and u = 2^-24
  (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., 4.2):

    float32:           bound = A = gamma S + 2 (world - 1) 2^-126
                                   + world 2^-53 S
    bfloat16, float16: bound = A + u_d (|E| + A) + s_d / 2

  u_d = 2^-8 (bfloat16) or 2^-11 (float16); s_d the dtype's smallest
  subnormal (rounding in the subnormal range). Overflow is possible where a
  partial sum may exceed float32's range, S (1 + gamma) >= float32 max, or
  the bound reaches the dtype's largest finite value, |E| + bound >= max.

  Args:
    inputs: the ranks' arrays, each (n,) of `dtype`.
    dtype: float32, bfloat16 or float16.

  Returns:
    (E, bound, overflow_possible), each of shape (n,): float64, float64, bool.

  Raises:
    ValueError: `dtype` is not a float dtype the kernels serve.
  """
  dtype = np.dtype(dtype)
  if dtype not in _UNIT_ROUNDOFF:
    raise ValueError(f"atomic_sum_bound is for float32, bfloat16 and float16, not {dtype}")
  with np.errstate(invalid="ignore"):  # NaN inputs are values here
    x = np.stack([np.asarray(v).astype(np.float64) for v in inputs])
  world = x.shape[0]
  xf = np.where(np.isfinite(x), x, 0.0)
  s = np.abs(xf).sum(axis=0)
  e = xf.sum(axis=0)
  k = world - 1
  gamma = k * _U_F32 / (1 - k * _U_F32)
  a = gamma * s + 2 * k * _F32_SMALLEST_NORMAL + world * 2.0 ** -53 * s
  if dtype == np.dtype(np.float32):
    bound = a
  else:
    tiny = float(ml_dtypes.finfo(dtype).smallest_subnormal)
    bound = a + _UNIT_ROUNDOFF[dtype] * (np.abs(e) + a) + tiny / 2
  top = float(ml_dtypes.finfo(dtype).max)
  overflow = (s * (1 + gamma) >= _F32_MAX) | (np.abs(e) + bound >= top)
  return e, bound, overflow


def atomic_sum_violations(got: np.ndarray, inputs: Sequence[np.ndarray], dtype) -> np.ndarray:
  """Elementwise: True where `got` breaks the rule of an atomic sum of
  `inputs` (`atomic_sum_bound`); the check of the non-deterministic
  algorithms (``jax_llar.algorithms.NON_DETERMINISTIC``) in place of
  bitwise equality with `rank_order_sum`.

  An element of `got` keeps the rule when:
    * int32: it equals the sum modulo 2^32 (integer atomics are exact);
    * an input is NaN, or the inputs hold +inf and -inf: it is NaN;
    * the inputs hold infinities of one sign: it is that infinity, or where
      overflow is possible (a finite partial sum overflowing to the other
      infinity first) any infinity or NaN;
    * all inputs are finite: it is finite and |got - E| <= bound, or where
      overflow is possible it is an infinity.
  A zero's sign is not checked (the accumulator starts at +0.0, so addends
  that are all -0.0 sum to +0.0). That every rank holds the same bits, and that NaNs are
  the canonical NaN, are separate checks.

  Args:
    got: shape (n,) or (..., n): outputs of `dtype` (one rank's, or several
      ranks' or calls' of the same inputs stacked in front).
    inputs: the ranks' arrays, each (n,) of `dtype`.
    dtype: float32, bfloat16, float16 or int32.

  Returns:
    A bool array of got's shape.

  Example::

    >>> x = [np.array([1.0, 2.0**-30], np.float32), np.array([2.0**-24, 1.0], np.float32)]
    >>> atomic_sum_violations(np.array([1.0, 1.0], np.float32), x, np.float32).tolist()
    [False, False]
    >>> atomic_sum_violations(np.array([1.5, 1.0], np.float32), x, np.float32).tolist()
    [True, False]
  """
  dtype = np.dtype(dtype)
  got = np.asarray(got)
  if dtype == np.dtype(np.int32):
    return np.asarray(got != rank_order_sum(inputs, dtype))
  e, bound, overflow = atomic_sum_bound(inputs, dtype)
  with np.errstate(invalid="ignore"):
    x = np.stack([np.asarray(v).astype(np.float64) for v in inputs])
    g = got.astype(np.float64)
  nan_in = np.isnan(x).any(axis=0)
  pos, neg = (x == np.inf).any(axis=0), (x == -np.inf).any(axis=0)
  want_nan = nan_in | (pos & neg)
  want_inf = ~want_nan & (pos | neg)
  inf_value = np.where(pos, np.inf, -np.inf)
  g_nan, g_inf = np.isnan(g), np.isinf(g)
  with np.errstate(invalid="ignore", over="ignore"):
    close = np.isfinite(g) & (np.abs(g - e) <= bound)
  finite_ok = close | (overflow & g_inf)
  inf_ok = (g == inf_value) | (overflow & (g_inf | g_nan))
  ok = np.where(want_nan, g_nan, np.where(want_inf, inf_ok, finite_ok))
  return ~ok
