"""examples/cg_solver on CPU.

In process, on the suite's host devices: the sharded stencil with each halo
exchange against a single-device numpy reference (bitwise on random float32
data: both add the same differences in the same order), the halo planes
themselves, the numpy reference against the matrix written out, the
manufactured solution and the condition number against their definitions,
and the solver's loop structures, halo variants and psum backends giving
bitwise the same iterations. In a subprocess, as a new user runs it from the
repository root: exit status 0, convergence, identical residual histories,
and the result file's shape.
"""

from __future__ import annotations

import json
import math
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np

import pytest

from cpu_helpers import user_env
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_llar

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "cg_solver"
sys.path.insert(0, str(EXAMPLE))
try:  # the example's modules import each other by their file names
  # pylint: disable=g-import-not-at-top,wrong-import-position
  import cg  # noqa: E402
  import checks  # noqa: E402
  import measure  # noqa: E402
  import poisson  # noqa: E402
  # pylint: enable=g-import-not-at-top,wrong-import-position
finally:
  sys.path.remove(str(EXAMPLE))

HALO_VARIANTS = {"ppermute": None, "psum:lax": lax.psum, "psum:llar": jax_llar.psum}


def _mesh(ranks: int) -> Mesh:
  return Mesh(np.array(jax.devices()[:ranks]), ("z",))


def _integers(shape, seed=0) -> np.ndarray:
  return np.random.default_rng(seed).integers(-8, 9, size=shape).astype(np.float32)


def _normal(shape, seed=0) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("halo", sorted(HALO_VARIANTS))
@pytest.mark.parametrize("ranks", [1, 2, 4, 8])
def test_sharded_stencil_matches_numpy(ranks, halo):
  shape = (3 * ranks, 5, 4)  # nz, ny, nx all different: a swapped axis shows
  u = _normal(shape, seed=ranks)
  mesh = _mesh(ranks)
  f = jax.jit(jax.shard_map(
      lambda v: poisson.apply_operator(v, "z", ranks, HALO_VARIANTS[halo]),
      mesh=mesh, in_specs=P("z"), out_specs=P("z")))
  got = np.asarray(f(jax.device_put(u, NamedSharding(mesh, P("z")))))
  np.testing.assert_array_equal(got, poisson.stencil_reference(u))


@pytest.mark.parametrize("halo", sorted(HALO_VARIANTS))
@pytest.mark.parametrize("ranks", [2, 3, 8])
def test_halo_planes_are_the_neighbours(ranks, halo):
  nzl = 2
  u = _normal((nzl * ranks, 3, 4), seed=7)
  mesh = _mesh(ranks)
  f = jax.jit(jax.shard_map(
      lambda v: poisson.halo_exchange(v, "z", ranks, HALO_VARIANTS[halo]),
      mesh=mesh, in_specs=P("z"), out_specs=(P("z"), P("z"))))
  below, above = (np.asarray(a) for a in f(jax.device_put(u, NamedSharding(mesh, P("z")))))
  for i in range(ranks):
    want_below = u[i * nzl - 1] if i > 0 else np.zeros_like(u[0])
    want_above = u[(i + 1) * nzl] if i < ranks - 1 else np.zeros_like(u[0])
    np.testing.assert_array_equal(below[i], want_below, err_msg=f"rank {i} below")
    np.testing.assert_array_equal(above[i], want_above, err_msg=f"rank {i} above")


def _matrix(shape) -> np.ndarray:
  """The 7-point matrix of a grid of `shape`, written out entry by entry."""
  idx = np.arange(int(np.prod(shape))).reshape(shape)
  a = np.zeros((idx.size, idx.size))
  for (k, j, i), row in np.ndenumerate(idx):
    a[row, row] = 6
    for dk, dj, di in ((1, 0, 0), (-1, 0, 0), (0, 1, 0), (0, -1, 0), (0, 0, 1), (0, 0, -1)):
      kk, jj, ii = k + dk, j + dj, i + di
      if 0 <= kk < shape[0] and 0 <= jj < shape[1] and 0 <= ii < shape[2]:
        a[row, idx[kk, jj, ii]] = -1
  return a


def test_stencil_reference_is_the_7_point_matrix():
  shape = (3, 4, 2)
  u = _integers(shape, seed=3).astype(np.float64)
  np.testing.assert_array_equal(poisson.stencil_reference(u).ravel(),
                                _matrix(shape) @ u.ravel())


@pytest.mark.parametrize("grid", [poisson.Grid(2, 3, 1), poisson.Grid(3, 6, 2)])
def test_condition_number(grid):
  eig = np.linalg.eigvalsh(_matrix(grid.shape))
  assert eig.min() > 0
  np.testing.assert_allclose(grid.condition_number(), eig.max() / eig.min(), rtol=1e-12)


@pytest.mark.parametrize("n,ranks", [(4, 1), (5, 2), (3, 4)])
def test_manufactured_solution_solves_the_discrete_problem(n, ranks):
  """A u = b exactly in exact arithmetic: in float64 to rounding."""
  grid = poisson.Grid.cubes(n, ranks)
  u = poisson.exact_solution(grid)
  b = poisson.right_hand_side(grid)
  np.testing.assert_allclose(poisson.stencil_reference(u), b, rtol=0, atol=1e-13)
  assert 0.5 < u.max() <= 1.0 and b.min() > 0


def _solve(grid, psum, structure, k=3, halo="ppermute", max_iters=200, tol=1e-6):
  mesh = _mesh(grid.ranks)
  length = max_iters if structure == "scan_unroll" else None
  solve = cg.make_solver(mesh, grid, psum, structure, k, history=max_iters + 1,
                         length=length, halo=halo)
  b = jax.device_put(poisson.right_hand_side(grid).astype(np.float32),
                     NamedSharding(mesh, P("z")))
  out = solve(b, jnp.int32(max_iters), jnp.float32(tol))
  it = int(out.iterations)
  return it, np.asarray(out.history)[:it + 1], np.asarray(out.x)


@pytest.mark.parametrize("ranks", [2, 4])
def test_structures_halos_and_backends_do_the_same_iterations(ranks):
  grid = poisson.Grid.cubes(5, ranks)
  ref_it, ref_hist, ref_x = _solve(grid, lax.psum, "while")
  assert 5 < ref_it < 200
  assert np.sqrt(ref_hist[-1] / ref_hist[0]) <= 1e-6 < np.sqrt(ref_hist[-2] / ref_hist[0])
  u = poisson.exact_solution(grid)
  assert np.linalg.norm(ref_x - u) / np.linalg.norm(u) <= (
      grid.condition_number() * (1e-6 + 2.0 ** -24))
  for structure in cg.STRUCTURES:
    for halo in cg.HALOS:
      for psum in (lax.psum, jax_llar.psum):
        it, hist, x = _solve(grid, psum, structure, halo=halo)
        what = f"{structure} {halo} {psum.__module__}"
        assert it == ref_it, what
        assert hist.tobytes() == ref_hist.tobytes(), what
        np.testing.assert_array_equal(x, ref_x, err_msg=what)


def test_while_k_stops_at_the_same_iteration_whatever_k():
  """The masked iterations of while_k: k larger than the iteration count,
  and k not dividing it."""
  grid = poisson.Grid.cubes(4, 2)
  ref = _solve(grid, lax.psum, "while")
  assert ref[0] == 9  # k = 13 is more than a whole solve, k = 2 and 4 do not divide it
  for k in (1, 2, 4, 13):
    got = _solve(grid, lax.psum, "while_k", k=k)
    assert got[0] == ref[0] and got[1].tobytes() == ref[1].tobytes(), k


def test_max_iters_stops_the_loop_and_a_negative_tol_disables_the_test():
  grid = poisson.Grid.cubes(4, 2)  # converges to 1e-6 in 9 iterations
  for structure in cg.STRUCTURES:
    it, hist, _ = _solve(grid, lax.psum, structure, max_iters=5, tol=0.0)
    assert it == 5 and len(hist) == 6 and np.all(hist > 0), structure
    it, _, _ = _solve(grid, lax.psum, structure, max_iters=24, tol=-1.0)
    assert it == 24, structure


def test_bad_arguments_raise():
  grid = poisson.Grid.cubes(4, 2)
  with pytest.raises(ValueError, match="structure"):
    cg.make_solver(_mesh(2), grid, lax.psum, "for")
  with pytest.raises(ValueError, match="halo"):
    cg.make_solver(_mesh(2), grid, lax.psum, "while", halo="send")
  with pytest.raises(ValueError, match="length"):
    cg.make_solver(_mesh(2), grid, lax.psum, "scan_unroll")
  with pytest.raises(ValueError, match="mesh"):
    cg.make_solver(_mesh(4), grid, lax.psum, "while")
  with pytest.raises(ValueError, match="bad grid"):
    poisson.Grid(4, 7, 2)


def test_single_device_rule():
  rule = checks.single_device_rule
  assert rule(100, 103, 1.0, 1.0 + 2.0 ** -20, 1e-6, 100.0, 1e-6)["ok"]
  assert not rule(100, 107, 1.0, 1.0, 0.0, 100.0, 1e-6)["iterations_ok"]
  assert not rule(10, 10, 1.0, 1.001, 0.0, 100.0, 1e-6)["first_rr_ok"]
  assert not rule(10, 10, 1.0, 1.0, 1e-3, 100.0, 1e-6)["solution_ok"]


def test_timing_scale_is_a_power_of_two_that_puts_bb_near_2_100():
  b = poisson.right_hand_side(poisson.Grid.cubes(6, 2)).astype(np.float32)
  scale = measure.timing_scale(b)
  assert np.log2(scale) == int(np.log2(scale))
  bb = np.sum((b.astype(np.float64) * scale) ** 2)
  assert 2.0 ** 99 <= bb <= 2.0 ** 101



def test_cg_solver_on_cpu(tmp_path):
  p = subprocess.run(
      [sys.executable, "examples/cg_solver/main.py", "--grids=4,6", "--iters=8,24",
       "--calls=4", "--rounds=2", "--structure=while,while_k", "--k=4",
       f"--out={tmp_path}"],
      cwd=ROOT, env=user_env(), capture_output=True, text=True, timeout=300)
  out = p.stdout + p.stderr
  assert p.returncode == 0, out[-3000:]
  assert "Traceback" not in out, out[-3000:]
  assert "all checks passed" in p.stdout
  files = list(tmp_path.glob("*-app-cg.json"))
  assert len(files) == 1, list(tmp_path.iterdir())
  assert str(files[0]) in p.stdout  # it says where the file went
  result = json.loads(files[0].read_text())
  assert result["level"] == "app" and isinstance(result["env"], dict)
  rows = result["rows"]
  assert [(r["workload"], r["structure"], r["impl"]) for r in rows] == [
      (poisson.Grid.cubes(n, 2).name(), s, i) for n in (4, 6) for s in ("while", "while_k4")
      for i in ("lax.psum", "llar.auto")]
  for r in rows:
    assert {"impl", "world_size", "dtype", "metric", "value", "workload"} <= set(r), r
    # A slope between two iteration counts on a busy 2-core CPU can come out
    # negative (CI saw -59.6 us with --calls=4); the row must carry a measured
    # number, not a positive one.
    assert r["metric"] == "cg_iter_us" and r["world_size"] == 2
    assert math.isfinite(r["value"]) and r["value"] != 0, r
    assert r["dtype"] == "float32" and r["correct"] is True
  assert result["cg"]["ok"] is True
  for g in result["cg"]["grids"]:
    for s, rec in g["structures"].items():
      conv = rec["convergence"]
      assert conv["lax.psum"]["converged"] and conv["llar.auto"]["converged"], s
      assert rec["histories_identical"] is True, s
      assert conv["lax.psum"]["history_sha256"] == conv["llar.auto"]["history_sha256"]
      assert rec["checks"]["error_ok"] and rec["checks"]["single_device"]["ok"], rec["checks"]
      hist = rec["relative_residual_history"]
      assert hist[0] == 1.0 and hist[-1] <= 1e-6
      assert len(hist) == conv["llar.auto"]["iterations"] + 1
    assert g["structures"]["while_k4"]["same_as_while"] is True
  try:
    import matplotlib  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    return
  assert files[0].with_suffix(".png").exists()
