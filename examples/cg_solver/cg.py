"""Conjugate gradient for the Poisson problem of poisson.py, in three loop
structures.

The iteration is textbook CG (Hestenes and Stiefel 1952; Saad, "Iterative
Methods for Sparse Linear Systems", 2nd ed., algorithm 6.18) from x0 = 0:

  q = A p                      halo exchange + 7-point stencil (poisson.py)
  alpha = rr / psum(p . q)     first all-reduce
  x += alpha p;  r -= alpha q
  rr' = psum(r . r)            second all-reduce
  p = r + (rr' / rr) p;  rr = rr'

and it stops when ``sqrt(rr) <= tol * ||b||`` or ``it == max_iters``, the
convergence test users write (relative residual, from the recursively
updated residual). Written as "not converged" rather than "residual above
tol", a NaN residual runs to max_iters instead of passing for convergence,
and a negative tol disables the test: the solve does exactly max_iters
iterations. Both dot products are scalar float32 all-reduces through
the `psum` argument (``lax.psum`` or ``jax_llar.psum``), as is the halo
exchange when it is done by all-reduce (``halo="psum"``); nothing else
differs between the two backends.

Loop structures (`STRUCTURES`):
  while        one ``lax.while_loop`` trip per iteration, the test in its
               predicate: what users write. XLA pays a fixed cost per trip.
  while_k      ``lax.while_loop`` whose body runs `k` iterations, so the
               predicate (and the trip cost) comes once per `k` iterations.
               Each of the `k` iterations re-evaluates the test and, once it
               fails, keeps the state unchanged (a select with a scalar
               predicate, fused into the update kernels), so the iterates,
               the iteration count and the residual history are those of
               `while`; at most k - 1 iterations' work is spent after
               convergence.
  scan_unroll  ``lax.scan`` of a fixed `length` (static) with ``unroll=k``,
               the same masked iteration inside: a trip count XLA knows, but
               no early exit (the loop always does `length` iterations'
               work).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import poisson

STRUCTURES = ("while", "while_k", "scan_unroll")
HALOS = ("ppermute", "psum")


class State(NamedTuple):
  """CG state on one rank: slabs x, r, p (nz_local, ny, nx); rr = r . r over
  all ranks (scalar); it = iterations done (int32 scalar); hist = r . r after
  each iteration, hist[0] = b . b (float32 (history,), or a (1,) dummy)."""
  x: jax.Array
  r: jax.Array
  p: jax.Array
  rr: jax.Array
  it: jax.Array
  hist: jax.Array


class Result(NamedTuple):
  """What a solve returns.

  Attributes:
    x: solution, the global grid (nz, ny, nx) float32, split over the mesh.
    iterations: iterations done (int32 scalar).
    rr: squared norm of the final recursively updated residual.
    bb: squared norm of b.
    history: rr after each iteration, history[0] = bb, float32 (history,);
      entries past `iterations` are zero. A (1,) dummy when no history was
      asked for.
  """
  x: jax.Array
  iterations: jax.Array
  rr: jax.Array
  bb: jax.Array
  history: jax.Array


def make_solver(mesh: Mesh, grid: poisson.Grid, psum: Callable, structure: str = "while_k",
                k: int = 8, history: int = 0, length: int | None = None,
                halo: str = "ppermute"):
  """A jitted CG solve of A x = b on `mesh` (a 1-D mesh, one slab per device).

  Args:
    mesh: 1-D mesh with ``grid.ranks`` devices; its axis splits z.
    grid: the grid (`poisson.Grid`).
    psum: the all-reduce of the two dot products, called as
      ``psum(scalar, axis_name)``: ``lax.psum`` or ``jax_llar.psum``.
    structure: one of `STRUCTURES` (see the module docstring).
    k: iterations per trip (while_k) or the scan's unroll (scan_unroll).
    history: length of the residual history buffer (0: none). It must be at
      least max_iters + 1.
    length: the scan's trip count (scan_unroll only, static); max_iters must
      not exceed it.
    halo: "ppermute" (one plane each way by ``lax.ppermute``) or "psum" (the
      planes through one all-reduce by `psum`; `poisson.halo_exchange`).

  Returns:
    ``solve(b, max_iters, tol) -> Result``: b is the global right-hand side
    (nz, ny, nx) float32 split over the mesh along z, max_iters an int32
    scalar, tol a float32 scalar (negative: exactly max_iters iterations).

  Raises:
    ValueError: unknown structure or halo, k < 1, scan without a length, or
      a mesh whose size is not ``grid.ranks``.
  """
  if structure not in STRUCTURES:
    raise ValueError(f"structure must be one of {STRUCTURES}, got {structure!r}")
  if halo not in HALOS:
    raise ValueError(f"halo must be one of {HALOS}, got {halo!r}")
  if k < 1:
    raise ValueError(f"k must be at least 1, got {k}")
  if structure == "scan_unroll" and not length:
    raise ValueError("structure 'scan_unroll' needs a static length")
  (axis,) = mesh.axis_names
  ranks = grid.ranks
  if mesh.size != ranks:
    raise ValueError(f"the mesh has {mesh.size} devices, the grid {ranks} slabs")

  halo_psum = psum if halo == "psum" else None

  def body(b, max_iters, tol):
    rr0 = psum(jnp.sum(b * b), axis)
    bnorm = jnp.sqrt(rr0)
    hist = jnp.zeros((max(history, 1),), b.dtype).at[0].set(rr0)

    def going(s):  # the convergence test users write: stop at tol or the limit
      return (s.it < max_iters) & ~(jnp.sqrt(s.rr) <= tol * bnorm)

    def iteration(s):
      q = poisson.apply_operator(s.p, axis, ranks, halo_psum)
      alpha = s.rr / psum(jnp.sum(s.p * q), axis)
      x = s.x + alpha * s.p
      r = s.r - alpha * q
      rr = psum(jnp.sum(r * r), axis)
      p = r + (rr / s.rr) * s.p
      return State(x, r, p, rr, s.it + 1, s.hist)

    def record(s):
      return s._replace(hist=s.hist.at[s.it].set(s.rr)) if history else s

    def masked_iteration(s):
      active = going(s)
      new = iteration(s)
      kept = [jnp.where(active, a, o) for a, o in zip(new[:-1], s[:-1])]
      return record(State(*kept, s.hist))

    s = State(jnp.zeros_like(b), b, b, rr0, jnp.zeros((), jnp.int32), hist)
    if structure == "while":
      s = lax.while_loop(going, lambda s: record(iteration(s)), s)
    elif structure == "while_k":
      def trip(s):
        for _ in range(k):
          s = masked_iteration(s)
        return s
      s = lax.while_loop(going, trip, s)
    else:
      s, _ = lax.scan(lambda s, _: (masked_iteration(s), None), s, None,
                      length=length, unroll=min(k, length))
    return Result(s.x, s.it, s.rr, rr0, s.hist)

  spec = P(axis)
  solve = jax.shard_map(body, mesh=mesh, in_specs=(spec, P(), P()),
                        out_specs=Result(spec, P(), P(), P(), P()))
  return jax.jit(solve)
