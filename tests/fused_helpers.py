"""Helpers for the fused all-reduce + residual add + RMSNorm kernel (not a test
file itself): its FFI contract, its grid rule, the host emulation of its
result (jax_llar.tools.loopback.fused, which the one-GPU loopback harness
checks with), and the comparison rule. Pure numpy; used by the CPU contract
test (test_fused_kernel_contract.py) and the GPU suite
(gpu/test_fused_kernel.py).

The rule (jax_llar/fused.py, `reference`): new_residual bitwise equal;
normed within NORMED_MAX_ULP units in the last place of x's dtype. The kernel
sums the squares in another order than XLA's reduction; for the 16-bit
dtypes that moves normed by at most one unit, for float32 by a few.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from jax_llar import algorithms, testing
from jax_llar.tools.loopback.fused import emulate, ulp_distance  # noqa: F401 (re-exported)
from jax_llar.tools.loopback import fused as loopback_fused

TARGET = "jax_llar_all_reduce_add_rms_norm"

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
DTYPES = (F32, BF16, F16)

# The largest payload per rank (x's bytes), the one-shot's: 64 * 512 * 8.
FUSED_MAX_BYTES = algorithms.FUSED_MAX_BYTES
# Grid constants (kernels/kernels.h, args.h): lines per block the rule aims
# at, the largest (portable) cluster, lines per block and blocks at most.
FUSED_BLOCK_LINES = algorithms.FUSED_BLOCK_LINES
FUSED_MAX_CLUSTER_BLOCKS = algorithms.FUSED_MAX_CLUSTER_BLOCKS
LINES_PER_BLOCK = 512
MAX_BLOCKS = 64

# normed against the reference, in units in the last place of x's dtype.
# Against XLA's reference on the GPU (same rsqrt instruction, another
# summation order of the squares): 1 for 16-bit dtypes, a few for float32.
# Against the host emulation (loopback_fused.emulate, with an exact
# reciprocal square root where the GPU's rsqrt.approx.f32 is within
# 2^-22.9): the same for 16-bit dtypes, more room for float32.
NORMED_MAX_ULP = {F32: 4, BF16: 1, F16: 1}
NORMED_MAX_ULP_EMULATION = loopback_fused.NORMED_MAX_ULP


# The grid rule is the library's (it decides at lowering time).
fused_grid = algorithms.add_rms_norm_grid


def served(shape, dtype, weight_dtype=None) -> bool:
  """Whether the FFI handler takes x of `shape` and `dtype` (weight of
  `weight_dtype`, default x's): float32, bfloat16 or float16, rank >= 1, a
  weight of x's dtype or float32, and the grid rule."""
  dtype = np.dtype(dtype)
  weight_dtype = dtype if weight_dtype is None else np.dtype(weight_dtype)
  if dtype not in DTYPES or weight_dtype not in (dtype, F32) or len(shape) < 1:
    return False
  rows = int(np.prod(shape[:-1], dtype=np.int64))
  return fused_grid(rows, int(shape[-1]), dtype.itemsize) is not None


def check(normed, new_residual, want_normed, want_new_residual, max_ulp: int,
          what: str = "") -> None:
  """Asserts new_residual bitwise equal and normed within `max_ulp`."""
  got, want = np.asarray(new_residual), np.asarray(want_new_residual)
  if not testing.bitwise_equal(got, want):
    where = np.argwhere(ulp_distance(got, want) != 0)[:5].tolist()
    raise AssertionError(f"{what} new_residual differs from the reference at {where}")
  dist = ulp_distance(normed, want_normed)
  worst = int(dist.max()) if dist.size else 0
  assert worst <= max_ulp, (
      f"{what} normed is {worst} ulp from the reference (at most {max_ulp}) at "
      f"{np.argwhere(dist == worst)[:5].tolist()}")


def random_case(rng: np.random.Generator, ranks: int, rows: int, d: int, dtype,
                weight_dtype=None):
  """x of every rank (ranks, rows, d), residual (rows, d) and weight (d,):
  standard normals (the residual and weight like a model's: gain near 1)."""
  dtype = np.dtype(dtype)
  weight_dtype = dtype if weight_dtype is None else np.dtype(weight_dtype)
  x = rng.standard_normal((ranks, rows, d)).astype(np.float32).astype(dtype)
  residual = rng.standard_normal((rows, d)).astype(np.float32).astype(dtype)
  weight = (1 + 0.1 * rng.standard_normal((d,))).astype(np.float32).astype(weight_dtype)
  return x, residual, weight
