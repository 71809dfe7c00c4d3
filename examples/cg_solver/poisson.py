"""The 3-D Poisson problem of the CG example, split into z-slabs.

-Laplace u = f on a box with u = 0 on its boundary, discretised with the
7-point stencil on a uniform grid of spacing h = 1 / (n + 1): interior points
(nz, ny, nx) = (nz, n, n), so the box is [0, 1] x [0, 1] x [0, (nz + 1) h]
(the example's grids give each rank a cube, nz = n * ranks). Arrays are
indexed [z, y, x]; the grid is split over the ranks of a 1-D mesh along z,
rank i holding the planes z = i * nz / ranks ... (i + 1) * nz / ranks - 1.

The linear system is A u = b with the unscaled stencil
  (A u)[k, j, i] = 6 u[k, j, i] - u[k +- 1, j, i] - u[k, j +- 1, i] - u[k, j, i +- 1]
(neighbours outside the grid are the zero boundary values) and b = h^2 f.
A is symmetric positive definite, so conjugate gradient applies.

Manufactured solution: u(x, y, z) = 64 x (1 - x) y (1 - y) s (1 - s) with
s = z / Lz, whose maximum is 1 and whose f = -Laplace u is known in closed
form. u is quadratic in each coordinate and the central second difference is
exact for quadratics, so the discrete solution equals u at the grid points:
the error of a computed solution against u measures the solver alone (no
discretisation error).

Halo exchange: before each stencil application every rank sends its top
plane to rank + 1 and its bottom plane to rank - 1 with ``lax.ppermute``
(one plane each way); rank 0 and the last rank receive zeros, the Dirichlet
boundary. An alternative exchanges the same planes through one all-reduce
(`halo_exchange`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


@dataclasses.dataclass(frozen=True)
class Grid:
  """Interior points (nz, n, n), split into `ranks` z-slabs.

  Attributes:
    n: points along x and along y.
    nz: points along z, a multiple of `ranks`.
    ranks: number of ranks (slabs).
  """
  n: int
  nz: int
  ranks: int

  def __post_init__(self):
    if min(self.n, self.nz, self.ranks) < 1 or self.nz % self.ranks:
      raise ValueError(f"bad grid: n={self.n}, nz={self.nz}, ranks={self.ranks}")

  @classmethod
  def cubes(cls, n: int, ranks: int) -> "Grid":
    """A cube of n^3 points on each of `ranks` ranks: (n * ranks, n, n)."""
    return cls(n, n * ranks, ranks)

  def split(self, ranks: int) -> "Grid":
    """The same global grid split into `ranks` slabs."""
    return dataclasses.replace(self, ranks=ranks)

  @property
  def shape(self) -> tuple[int, int, int]:
    """Global interior points (nz, ny, nx)."""
    return (self.nz, self.n, self.n)

  @property
  def local_shape(self) -> tuple[int, int, int]:
    """One rank's slab (nz / ranks, n, n)."""
    return (self.nz // self.ranks, self.n, self.n)

  @property
  def h(self) -> float:
    """Grid spacing, the same along every axis."""
    return 1.0 / (self.n + 1)

  @property
  def lz(self) -> float:
    """Length of the box along z."""
    return (self.nz + 1) * self.h

  def name(self) -> str:
    """Workload name, e.g. ``poisson3d 32x16x16 (16^3 per rank)`` (z first)."""
    nzl, ny, nx = self.local_shape
    per = f"{nx}^3" if nzl == nx else f"{nzl}x{ny}x{nx}"
    return f"poisson3d {self.nz}x{ny}x{nx} ({per} per rank)"

  def condition_number(self) -> float:
    """The 2-norm condition number of A (its largest over its smallest
    eigenvalue, both known in closed form for the 7-point stencil)."""
    def lam(k, m):
      return 4.0 * math.sin(k * math.pi / (2 * (m + 1))) ** 2
    lo = sum(lam(1, m) for m in self.shape)
    hi = sum(lam(m, m) for m in self.shape)
    return hi / lo


def coordinates(grid: Grid) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Coordinates of the interior points, float64, broadcastable to
  ``grid.shape`` (z, y, x)."""
  nz, ny, nx = grid.shape
  h = grid.h
  z = (np.arange(nz) + 1.0)[:, None, None] * h
  y = (np.arange(ny) + 1.0)[None, :, None] * h
  x = (np.arange(nx) + 1.0)[None, None, :] * h
  return z, y, x


def exact_solution(grid: Grid) -> np.ndarray:
  """The manufactured solution u at the interior points, float64, shape
  ``grid.shape``; its maximum over the box is 1."""
  z, y, x = coordinates(grid)
  s = z / grid.lz
  return 64.0 * (x * (1 - x)) * (y * (1 - y)) * (s * (1 - s))


def right_hand_side(grid: Grid) -> np.ndarray:
  """b = h^2 f with f = -Laplace u of `exact_solution`, float64, shape
  ``grid.shape``."""
  z, y, x = coordinates(grid)
  s = z / grid.lz
  gx, gy, gs = x * (1 - x), y * (1 - y), s * (1 - s)
  # d2/dx2 of x (1 - x) is -2; d2/dz2 of s (1 - s) is -2 / Lz^2.
  f = 128.0 * (gy * gs + gx * gs + gx * gy / grid.lz ** 2)
  return grid.h ** 2 * f


def stencil_reference(u: np.ndarray) -> np.ndarray:
  """A u on one device with numpy, zero boundary on every face; any float
  dtype, computed in that dtype with the additions of `apply_stencil` in the
  same order (so float32 results agree bitwise)."""
  p = np.pad(u, 1)
  return (((u - p[:-2, 1:-1, 1:-1]) + (u - p[2:, 1:-1, 1:-1]))
          + ((u - p[1:-1, :-2, 1:-1]) + (u - p[1:-1, 2:, 1:-1]))
          + ((u - p[1:-1, 1:-1, :-2]) + (u - p[1:-1, 1:-1, 2:])))


def halo_exchange(u: jax.Array, axis: str, ranks: int,
                  psum: Callable | None = None) -> tuple[jax.Array, jax.Array]:
  """The neighbours' boundary planes of a slab, inside ``shard_map``.

  Args:
    u: this rank's slab (nz_local, ny, nx).
    axis: the mesh axis the slabs are split over.
    ranks: the number of ranks along `axis`.
    psum: None (the default) exchanges the planes with two ``lax.ppermute``
      calls, one plane each way. Given an all-reduce (``lax.psum`` or
      ``jax_llar.psum``), every rank instead writes its two boundary planes
      into its own slots of a zero (ranks, 2, ny, nx) buffer and the buffer
      is summed over the ranks: each slot has one nonzero contribution, so
      the planes arrive exactly (only the sign of a zero can change), in one
      all-reduce of 2 x ranks planes per rank.

  Returns:
    (below, above), each (1, ny, nx): the top plane of rank - 1 and the
    bottom plane of rank + 1; zeros where there is no such rank (the
    Dirichlet boundary).
  """
  if ranks == 1:
    zero = jnp.zeros_like(u[:1])
    return zero, zero
  if psum is None:
    below = lax.ppermute(u[-1:], axis, [(i, i + 1) for i in range(ranks - 1)])
    above = lax.ppermute(u[:1], axis, [(i + 1, i) for i in range(ranks - 1)])
    return below, above
  me = lax.axis_index(axis)
  mine = jnp.concatenate([u[:1], u[-1:]], axis=0)[None]  # (1, 2, ny, nx)
  slots = lax.dynamic_update_slice_in_dim(
      jnp.zeros((ranks,) + mine.shape[1:], u.dtype), mine, me, axis=0)
  every = psum(slots, axis)  # every[i] = rank i's (bottom, top) planes
  below = lax.dynamic_index_in_dim(every, jnp.maximum(me - 1, 0), axis=0,
                                   keepdims=False)[1:2]
  above = lax.dynamic_index_in_dim(every, jnp.minimum(me + 1, ranks - 1), axis=0,
                                   keepdims=False)[0:1]
  below = jnp.where(me > 0, below, jnp.zeros_like(below))
  above = jnp.where(me < ranks - 1, above, jnp.zeros_like(above))
  return below, above


def apply_stencil(u: jax.Array, below: jax.Array, above: jax.Array) -> jax.Array:
  """A u on one slab, given the halo planes of `halo_exchange`.

  Args:
    u: the slab (nz_local, ny, nx).
    below, above: (1, ny, nx) planes next to the slab's first and last plane.

  Returns:
    A u restricted to the slab, shape and dtype of `u`. It is computed as a
    sum of differences, (u - u_below) + (u - u_above) + ..., in a fixed
    order and without a multiplication, so no compiler can contract it into
    fused multiply-adds: the result is the same bitwise however XLA fuses
    it.
  """
  uz = jnp.concatenate([below, u, above], axis=0)
  uy = jnp.pad(u, ((0, 0), (1, 1), (0, 0)))
  ux = jnp.pad(u, ((0, 0), (0, 0), (1, 1)))
  return (((u - uz[:-2]) + (u - uz[2:])) + ((u - uy[:, :-2]) + (u - uy[:, 2:]))
          + ((u - ux[:, :, :-2]) + (u - ux[:, :, 2:])))


def apply_operator(u: jax.Array, axis: str, ranks: int,
                   halo_psum: Callable | None = None) -> jax.Array:
  """A u on one slab inside ``shard_map``: `halo_exchange` (through
  `halo_psum` when given), then `apply_stencil`."""
  below, above = halo_exchange(u, axis, ranks, halo_psum)
  return apply_stencil(u, below, above)
