"""Per-iteration time of CG solves: the slope method with interleaved rounds.

A jitted call has a fixed cost of its own (dispatch, the setup before the
loop, the result), so the per-iteration time is the slope between two
iteration counts K1 < K2: (median wall time of a K2 call - median of a K1
call) / (K2 - K1), as benchmarks/METHOD.md in the repository does for psum
chains. The calls run with the convergence test disabled (a negative
tolerance), so that each does exactly its K iterations; the impls are timed
in rounds whose order alternates, so that a slow drift of the machine affects
them alike.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np


def timing_scale(b: np.ndarray) -> float:
  """The power of two 2^e that the timed calls multiply b by.

  Without a convergence test a CG loop runs past the solution, and the
  recursively updated residual keeps falling until r.r leaves the normal
  float32 range; after r.r = 0 the next alpha is 0/0 and the iterates turn
  to NaN (the loop goes on at the same speed on GPUs, but its numbers mean
  nothing). Scaling b by a power of two scales every iterate exactly and
  changes no rounding; this one starts r.r near 2^100 (the top of the range
  is about 2^128), which leaves the recursion about twice the room it has
  from b itself.
  """
  bb = float(np.sum(np.asarray(b, np.float64) ** 2))
  return 2.0 ** round((100 - math.log2(bb)) / 2)


def time_per_iteration(solves: dict[str, dict[int, Callable]], b: jax.Array,
                       iters: tuple[int, int], calls: int, rounds: int) -> dict[str, dict]:
  """Times fixed-count solves of several impls, interleaved.

  Args:
    solves: per impl, per iteration count K (both of `iters`), a compiled
      ``solve(b, max_iters, tol)`` (`cg.make_solver`); the two counts may
      share one function.
    b: right-hand side (already scaled by `timing_scale`).
    iters: (K1, K2), K1 < K2.
    calls: timed calls per count and impl, spread over `rounds`.
    rounds: rounds; in each, every impl times calls // rounds calls of K1
      iterations and as many of K2, impls in an order that alternates.

  Returns:
    per impl: us_per_iteration (the slope over all calls), us_round_min,
    us_round_max, us_round_median (the slopes of single rounds), call_ms
    (median per K, milliseconds, keys as strings), calls_each, short
    (calls that ended before their K iterations: 0 unless the loop is
    wrong) and finite (whether r.r was still finite after every K2 call).
  """
  k1, k2 = iters
  impls: Sequence[str] = list(solves)
  off = jnp.asarray(-1.0, jnp.float32)  # no convergence test
  count = {kk: jnp.asarray(kk, jnp.int32) for kk in iters}
  per_round = max(1, calls // rounds)
  state = {impl: {"t": {k1: [], k2: []}, "slopes": [], "short": 0, "finite": True}
           for impl in impls}
  for r in range(rounds):
    for impl in (impls if r % 2 == 0 else impls[::-1]):
      st, med = state[impl], {}
      for kk in iters:
        ts = []
        for _ in range(per_round):
          t0 = time.perf_counter()
          out = solves[impl][kk](b, count[kk], off)
          jax.block_until_ready(out)
          ts.append(time.perf_counter() - t0)
          st["short"] += int(out.iterations) != kk
          st["finite"] &= kk == k1 or bool(np.isfinite(out.rr))
        st["t"][kk] += ts
        med[kk] = statistics.median(ts)
      st["slopes"].append((med[k2] - med[k1]) / (k2 - k1))
  result = {}
  for impl, st in state.items():
    slope = (statistics.median(st["t"][k2]) - statistics.median(st["t"][k1])) / (k2 - k1)
    result[impl] = {
        "us_per_iteration": slope * 1e6,
        "us_round_min": min(st["slopes"]) * 1e6,
        "us_round_max": max(st["slopes"]) * 1e6,
        "us_round_median": statistics.median(st["slopes"]) * 1e6,
        "call_ms": {str(kk): statistics.median(st["t"][kk]) * 1e3 for kk in iters},
        "calls_each": per_round * rounds,
        "short": st["short"],
        "finite": st["finite"],
    }
  return result
