"""The correctness rules of the CG example (pure functions of numbers).

The discrete solution of poisson.py equals the manufactured solution u at
the grid points, so a computed solution x is judged against u itself. For a
symmetric positive definite A, x - u = A^-1 (A x - b), hence
||x - u|| / ||u|| <= kappa(A) ||b - A x|| / ||b|| (the residual bound of
Golub and Van Loan, "Matrix Computations", 4th ed., section 2.6.2). CG stops
on its recursively updated residual, which float32 rounding separates from
the true residual b - A x; the rule allows for that with one unit roundoff
of float32 (2^-24) next to the tolerance.
"""

from __future__ import annotations

import math

F32_UNIT_ROUNDOFF = 2.0 ** -24
# r.r after the first iteration: the same numbers summed in another order.
FIRST_RR_REL_TOL = 2.0 ** -16


def error_bound(kappa: float, tol: float) -> float:
  """Largest relative 2-norm error against the exact solution allowed for a
  solve stopped at relative residual `tol`: kappa (tol + 2^-24)."""
  return kappa * (tol + F32_UNIT_ROUNDOFF)


def iteration_slack(iterations: int) -> int:
  """How far two iteration counts of the same problem may differ when only
  the order of the sums differs: max(2, 5%)."""
  return max(2, math.ceil(0.05 * iterations))


def single_device_rule(iters_n: int, iters_1: int, rr1_n: float, rr1_1: float,
                       rel_diff: float, kappa: float, tol: float) -> dict:
  """Compares a solve on N devices with one of the same global grid on one.

  The two differ only in the order in which the dot products are summed
  (per-rank partial sums, then the all-reduce). CG amplifies that rounding
  from iteration to iteration, so the rule compares what it does not blur:
  the iteration counts within `iteration_slack`, r.r after the first
  iteration within 2^-16 relative, and the solutions within twice
  `error_bound` of each other (each is within `error_bound` of the exact
  solution).

  Args:
    iters_n, iters_1: iterations of the N-device and the 1-device solve.
    rr1_n, rr1_1: r.r after their first iteration.
    rel_diff: ||x_N - x_1|| / ||x_1|| (2-norms).
    kappa: condition number of A.
    tol: the relative residual both solves stopped at.

  Returns:
    dict: iterations, iterations_n, iterations_ok, first_rr_rel_diff,
    first_rr_ok, solution_rel_diff, solution_bound, solution_ok, ok.
  """
  iterations_ok = abs(iters_n - iters_1) <= iteration_slack(max(iters_n, iters_1))
  first = abs(rr1_n - rr1_1) / abs(rr1_1) if rr1_1 else float(rr1_n != rr1_1)
  bound = 2 * error_bound(kappa, tol)
  return {"iterations": iters_1, "iterations_n": iters_n, "iterations_ok": iterations_ok,
          "first_rr_rel_diff": first, "first_rr_ok": first <= FIRST_RR_REL_TOL,
          "solution_rel_diff": rel_diff, "solution_bound": bound,
          "solution_ok": rel_diff <= bound,
          "ok": iterations_ok and first <= FIRST_RR_REL_TOL and rel_diff <= bound}
