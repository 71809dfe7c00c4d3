"""Conjugate gradient on a 3-D Poisson problem: lax.psum against jax_llar.psum.

  python examples/cg_solver/main.py [--grids 16,32,64,128,256] [--structure while_k]

Run from the repository root. -Laplace u = f on a box with zero Dirichlet
boundary, the 7-point stencil applied matrix-free (poisson.py), the grid
split into z-slabs over all local devices (a 1-D mesh; each rank holds an
n^3 cube for every n of --grids). Each CG iteration (cg.py) exchanges one
halo plane each way with lax.ppermute (or, with --halo psum, through one
all-reduce) and reduces its two dot products with psum; the loop tests the
relative residual against --tol in its predicate. Everything is float32
(jax_llar serves float32, bfloat16 and float16; float64 is not offered). For
every grid and loop structure it runs the same program with lax.psum and
with jax_llar.psum (impl names lax.psum and llar.auto):

  timing       time per iteration from calls with tolerance 0, each doing
               exactly K iterations: the slope between the median wall times
               at the two counts of --iters, over --calls calls of each in
               --rounds interleaved rounds (measure.py);
  convergence  a solve to --tol that records r.r after every iteration; the
               residual histories of the two impls are compared bitwise. On
               2 ranks they must be identical (jax_llar's sum of two ranks and
               NCCL's are the same correctly rounded float32 sum; on CPU both
               impls are lax.psum); with more ranks jax_llar may add in
               another order, and the counts must agree within max(2, 5%);
  correctness  the solution against the manufactured analytic solution, and
               against a solve of the same global grid on one device, with
               the rules of checks.py; and, for a structure other than while,
               whether its residual history equals while's bitwise.

It prints a summary per grid, writes <machine>-<yyyymmdd>-app-cg<tag>.json
(or --json) in the result-file shape of benchmarks/METHOD.md in the
repository (level "app"; one row per grid, structure and impl with metric
"cg_iter_us", value in microseconds per iteration and workload naming the
grid; the convergence records under "cg") and a PNG of time per iteration
against grid points per rank. The exit status is 1 when a check fails: no
convergence, histories that differ where they must be identical, an error
bound exceeded, or a timed call that did not do its iterations.

Without a GPU it runs on forced CPU devices (it sets JAX_PLATFORMS=cpu and
XLA_FLAGS and says so) with small default grids; jax_llar.psum lowers to
lax.psum there, so both rows differ only by noise.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import time
from typing import NamedTuple

from absl import flags

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_llar
from jax_llar.tools import _cli, host, report
from jax_llar.tools.progress import Progress

import cg
import checks
import measure
import poisson

GPU_GRIDS = ("16", "32", "64", "128", "256")
CPU_GRIDS = ("12", "16", "20")
IMPLS = ("lax.psum", "llar.auto")

GRIDS = flags.DEFINE_list(
    "grids", None,
    "Points per edge of each rank's cube: the global grid is (n x ranks, n, n) "
    f"(default: {','.join(GPU_GRIDS)} on GPUs, {','.join(CPU_GRIDS)} on CPU).")
# The default structure is the one the loop study (bench --level loop)
# finds best on GPUs.
STRUCTURE = flags.DEFINE_list(
    "structure", ["while_k"],
    "Loop structures, each timed and checked for both impls: while (one "
    "lax.while_loop trip per iteration, as users write it), while_k (--k "
    "iterations per while_loop trip, the convergence test re-evaluated in "
    "each: the same arithmetic as while), scan_unroll (lax.scan of a fixed "
    "length with unroll --k: no early exit).")
K = flags.DEFINE_integer("k", 8, "Iterations per trip (while_k) or unroll (scan_unroll).",
                         lower_bound=1)
HALO = flags.DEFINE_enum(
    "halo", "ppermute", list(cg.HALOS),
    "Halo exchange: ppermute (one plane each way with lax.ppermute) or psum "
    "(both planes of every rank through one all-reduce of the impl; exact).")
ITERS = flags.DEFINE_list(
    "iters", ["16", "144"],
    "The two iteration counts K1,K2 of the timed calls (multiples of --k "
    "for while_k and scan_unroll).")
CALLS = flags.DEFINE_integer("calls", 60,
                             "Timed calls per iteration count and impl.", lower_bound=1)
ROUNDS = flags.DEFINE_integer("rounds", 6, "Interleaved timing rounds.", lower_bound=1)
TOL = flags.DEFINE_float("tol", 1e-6, "Relative residual of the convergence runs.",
                         lower_bound=0.0)
MAX_ITERS = flags.DEFINE_integer("max_iters", 10000,
                                 "Iteration limit of the convergence runs.", lower_bound=1)
RANKS = flags.DEFINE_integer("ranks", 0, "Devices to use, the number of slabs (0: all).",
                             lower_bound=0)
SINGLE = flags.DEFINE_bool("single_device_check", True,
                           "Also solve each global grid on one device and compare.")
CPU_DEVICES = flags.DEFINE_integer("cpu_devices", 2,
                                   "Host devices to force when there is no GPU.",
                                   lower_bound=1)
OUT = flags.DEFINE_string(
    "out", report.default_out_dir(),
    report.OUT_HELP)
TAG = flags.DEFINE_string("tag", "", "Suffix of the result file names in --out.")
JSON = flags.DEFINE_string("json", None, "Write the result to this file instead (the "
                           "plot beside it, .png), overwriting it.")

flags.register_validator("grids", lambda v: v is None or all(
    s.isdigit() and int(s) > 0 for s in v), "--grids must be positive integers")
flags.register_validator("structure", lambda v: bool(v) and all(
    s in cg.STRUCTURES for s in v), f"--structure must be among {', '.join(cg.STRUCTURES)}")
flags.register_validator("iters", lambda v: len(v) == 2 and all(
    s.isdigit() for s in v) and 0 < int(v[0]) < int(v[1]),
    "--iters must be two increasing positive integers K1,K2")
flags.register_multi_flags_validator(
    ["iters", "k", "structure"],
    lambda f: f["structure"] == ["while"] or all(
        int(v) % f["k"] == 0 for v in f["iters"] if v.isdigit()),
    "--iters must be multiples of --k for while_k and scan_unroll")


def structure_name(structure: str, k: int) -> str:
  """The structure as rows name it: ``while``, ``while_k8``, ``scan_unroll8``."""
  return structure if structure == "while" else f"{structure}{k}"


@dataclasses.dataclass(frozen=True)
class Settings:
  """What one run does (the flags of the same names)."""
  grids: tuple[int, ...]
  structures: tuple[str, ...]  # in the order of cg.STRUCTURES: while first
  k: int
  halo: str
  iters: tuple[int, int]
  calls: int
  rounds: int
  tol: float
  max_iters: int
  ranks: int
  single_device_check: bool

  def to_dict(self) -> dict:
    d = dataclasses.asdict(self)
    d["structures"] = [structure_name(s, self.k) for s in self.structures]
    return d


class Solve(NamedTuple):
  """A convergence run on the host: iterations, r.r after each (float32,
  iterations + 1 entries, [0] = b.b) and the solution (float32 global grid)."""
  iterations: int
  history: np.ndarray
  x: np.ndarray

  @property
  def relative_residual(self) -> float:
    return float(np.sqrt(self.history[-1] / self.history[0]))

  def same(self, other: "Solve") -> bool:
    """Bitwise the same iterations (counts and residual histories)."""
    return self.iterations == other.iterations and (
        self.history.tobytes() == other.history.tobytes())


def converge(solve, b, s: Settings) -> Solve:
  """Runs `solve` (made with a history of s.max_iters + 1) to s.tol."""
  out = solve(b, jnp.asarray(s.max_iters, jnp.int32), jnp.asarray(s.tol, jnp.float32))
  it = int(out.iterations)
  return Solve(it, np.asarray(out.history)[:it + 1], np.asarray(out.x))


def rel2(a: np.ndarray, ref: np.ndarray) -> float:
  """||a - ref|| / ||ref||, 2-norms in float64."""
  a, ref = np.asarray(a, np.float64).ravel(), np.asarray(ref, np.float64).ravel()
  return float(np.linalg.norm(a - ref) / np.linalg.norm(ref))


def run(s: Settings) -> dict:
  """Times and checks CG for every grid and structure with both impls.

  Returns:
    dict with rows (result-file rows), grids (per grid: workload, shape,
    condition number, and per structure the convergence runs and the
    checks), ok (every check passed), platform, device_kind, ranks and
    settings.
  """
  devices = jax.devices()
  platform = devices[0].platform
  ranks = s.ranks or len(devices)
  if ranks > len(devices):
    raise ValueError(f"--ranks {ranks}: only {len(devices)} devices here")
  mesh = Mesh(np.array(devices[:ranks]), ("z",))
  k1, k2 = s.iters
  print(f"cg_solver: CG on 3-D Poisson, float32, {ranks} ranks over {platform} "
        f"({devices[0].device_kind}), halo {s.halo}, structures "
        f"{', '.join(structure_name(st, s.k) for st in s.structures)}; timing {k1} and "
        f"{k2} iterations, {s.calls} calls each in {s.rounds} rounds; convergence to "
        f"tol {s.tol:g}")
  if not jax_llar.status()["active"]:
    print("jax_llar.psum lowers to lax.psum here, so both impls use the same all-reduce.")
  rows, records = [], []
  progress = Progress(len(s.grids), "cg")
  for n in s.grids:
    grid_rows, record = run_grid(poisson.Grid.cubes(n, ranks), mesh, s)
    rows += grid_rows
    records.append(record)
    progress.step(f"grid {n}^3 per rank")
  return {"rows": rows, "grids": records, "ok": all(r["ok"] for r in records),
          "histories_identical": all(v["histories_identical"] for r in records
                                     for v in r["structures"].values()),
          "platform": platform, "device_kind": devices[0].device_kind, "ranks": ranks,
          "settings": s.to_dict()}


def run_grid(grid: poisson.Grid, mesh: Mesh, s: Settings) -> tuple[list[dict], dict]:
  """One grid: per structure, timing and convergence of both impls and the
  checks. Returns (rows, record)."""
  psums = {"lax.psum": lax.psum, "llar.auto": jax_llar.psum}
  sharding = NamedSharding(mesh, P("z"))
  kappa = grid.condition_number()
  b_host = poisson.right_hand_side(grid).astype(np.float32)
  b = jax.device_put(b_host, sharding)
  b_timed = jax.device_put(b_host * np.float32(measure.timing_scale(b_host)), sharding)
  u = poisson.exact_solution(grid)
  history = s.max_iters + 1
  print(f"\n{grid.name()}: kappa(A) {kappa:.3g}, {grid.n ** 3 * 4} bytes per vector per rank")

  def solver(impl, structure, history=0, length=None):
    return cg.make_solver(mesh, grid, psums[impl], structure, s.k, history=history,
                          length=length, halo=s.halo)

  single = None  # the same global grid on one device
  if s.single_device_check:
    mesh1 = Mesh(np.array(mesh.devices.flat[:1]), ("z",))
    single = converge(cg.make_solver(mesh1, grid.split(1), lax.psum, "while",
                                     history=history),
                      jax.device_put(b_host, mesh.devices.flat[0]), s)
  # The rolled loop, the reference of the other structures' arithmetic.
  rolled = None
  if "while" not in s.structures:
    rolled = converge(solver("lax.psum", "while", history), b, s)

  rows, record = [], {"workload": grid.name(), "n": grid.n, "shape": list(grid.shape),
                      "points_per_rank": grid.n ** 3, "condition_number": kappa,
                      "structures": {}}
  for structure in s.structures:
    name = structure_name(structure, s.k)
    # Timing: fixed iteration counts (tolerance 0), both impls interleaved.
    solves, fast, lowered = {}, {}, {}
    for impl in IMPLS:
      logged = len(jax_llar.dispatch_log())
      if structure == "scan_unroll":
        solves[impl] = {kk: solver(impl, structure, length=kk) for kk in s.iters}
      else:
        solves[impl] = dict.fromkeys(s.iters, solver(impl, structure))
      for kk, fn in solves[impl].items():  # compiles and warms up
        jax.block_until_ready(fn(b_timed, jnp.asarray(kk, jnp.int32), jnp.float32(-1)))
      if impl == "llar.auto":  # what each distinct psum of the program lowered to
        lowered[impl] = sorted({(d.bytes_per_rank, d.impl, d.reason)
                                for d in jax_llar.dispatch_log()[logged:]})
        fast[impl] = bool(lowered[impl]) and all(im != "lax.psum" for _, im, _ in lowered[impl])
      else:
        fast[impl] = None
    timing = measure.time_per_iteration(solves, b_timed, s.iters, s.calls, s.rounds)

    # Convergence to tol, with residual histories.
    length = s.max_iters if structure == "scan_unroll" else None
    conv = {impl: converge(solver(impl, structure, history, length), b, s) for impl in IMPLS}
    a, c = conv["lax.psum"], conv["llar.auto"]
    if structure == "while":
      rolled = a
    identical = a.same(c)
    # Two ranks: jax_llar's sum and NCCL's are the same correctly rounded
    # float32 sum. More ranks may add in another order; off the fast path
    # both programs are lax.psum's. (The halo all-reduce of halo "psum" is
    # exact either way.)
    any_fast = any(im != "lax.psum" for _, im, _ in lowered["llar.auto"])
    bitwise_expected = grid.ranks <= 2 or not any_fast
    err = {impl: rel2(v.x, u) for impl, v in conv.items()}
    # The loop stopped on the test, not on the limit (or at the limit on the
    # iteration that reached tol).
    converged = {impl: v.iterations < s.max_iters or v.relative_residual <= s.tol
                 for impl, v in conv.items()}
    verdict = {
        "converged": all(converged.values()),
        "histories_identical": identical,
        "histories_ok": identical or (not bitwise_expected and abs(
            a.iterations - c.iterations) <= checks.iteration_slack(a.iterations)),
        "error_rel2": err,
        "error_max": {impl: float(np.abs(v.x - u).max()) for impl, v in conv.items()},
        "error_bound": checks.error_bound(kappa, s.tol),
        "timed_iterations_ok": all(t["short"] == 0 for t in timing.values()),
    }
    verdict["error_ok"] = all(e <= verdict["error_bound"] for e in err.values())
    if single is not None:
      verdict["single_device"] = checks.single_device_rule(
          c.iterations, single.iterations, float(c.history[min(1, c.iterations)]),
          float(single.history[min(1, single.iterations)]), rel2(c.x, single.x), kappa, s.tol)
    passed = all(verdict[key] for key in ("converged", "histories_ok", "error_ok",
                                          "timed_iterations_ok"))
    passed = bool(passed and verdict.get("single_device", {"ok": True})["ok"])
    same_as_while = None if structure == "while" else a.same(rolled)
    record["structures"][name] = {
        "convergence": {impl: {"iterations": v.iterations,
                               "relative_residual": v.relative_residual,
                               "converged": converged[impl],
                               "history_sha256": hashlib.sha256(v.history.tobytes()).hexdigest()}
                        for impl, v in conv.items()},
        "histories_identical": identical, "bitwise_expected": bitwise_expected,
        "solutions_identical": a.x.tobytes() == c.x.tobytes(),
        "same_as_while": same_as_while, "fast_path": fast["llar.auto"],
        # llar.auto's distinct psums: [bytes per rank, impl, reason].
        "psum_lowerings": [list(t) for t in lowered["llar.auto"]],
        "checks": verdict, "ok": passed,
        # sqrt(r.r / b.b) after each iteration of the llar.auto solve.
        "relative_residual_history": [float(v) for v in np.sqrt(c.history / c.history[0])],
    }
    for impl in IMPLS:
      t = timing[impl]
      rows.append({
          "impl": impl, "world_size": grid.ranks, "dtype": "float32",
          "metric": "cg_iter_us", "value": t["us_per_iteration"], "workload": grid.name(),
          "structure": name, "halo": s.halo, "grid": list(grid.shape),
          "points_per_rank": grid.n ** 3, "vector_bytes_per_rank": grid.n ** 3 * 4,
          "iters": list(s.iters), "calls_each": t["calls_each"], "call_ms": t["call_ms"],
          "us_round_min": t["us_round_min"], "us_round_max": t["us_round_max"],
          "us_round_median": t["us_round_median"],
          "timed_rr_finite": t["finite"],
          "converged_iterations": conv[impl].iterations, "histories_identical": identical,
          "correct": passed,
          # llar.auto lowered to lax.psum wherever the fast path was off.
          "fast_path": fast[impl]})
    _print_structure(name, timing, a, c, record["structures"][name])
  record["ok"] = all(v["ok"] for v in record["structures"].values())
  return rows, record


def _print_structure(name: str, timing: dict, a: Solve, c: Solve, rec: dict) -> None:
  lax_us = timing["lax.psum"]["us_per_iteration"]
  llar_us = timing["llar.auto"]["us_per_iteration"]
  slow = [b for b, im, _ in rec["psum_lowerings"] if im == "lax.psum"]
  note = ("" if not slow else " (fast path off: both are lax.psum)"
          if len(slow) == len(rec["psum_lowerings"])
          else f" (on lax.psum: the psums of {', '.join(map(str, slow))} bytes per rank)")
  print(f"  {name:14s} us/iteration: lax.psum {lax_us:9.2f}  llar.auto {llar_us:9.2f}"
        f"  ratio {lax_us / llar_us:5.2f}{note}")
  why = "" if rec["bitwise_expected"] else " (not required: more than 2 ranks)"
  vs_while = "" if rec["same_as_while"] is None else f"; same as while: {rec['same_as_while']}"
  print(f"  {'':14s} converged in {a.iterations} / {c.iterations} iterations (lax.psum / "
        f"llar.auto); residual histories identical: {rec['histories_identical']}{why}{vs_while}")
  v = rec["checks"]
  sd = v.get("single_device")
  print(f"  {'':14s} error vs analytic (rel. 2-norm) {v['error_rel2']['llar.auto']:.2e} "
        f"<= {v['error_bound']:.2e}: {v['error_ok']}"
        + (f"; 1 device: {sd['iterations']} iterations, solutions differ by "
           f"{sd['solution_rel_diff']:.2e}: {sd['ok']}" if sd else "")
        + ("" if rec["ok"] else "  CHECK FAILED"))


def print_summary(rows: list[dict], records: list[dict]) -> None:
  """The table printed last: per grid and structure, microseconds per
  iteration of each impl, their ratio, iterations to converge and whether
  the residual histories are identical."""
  print(f"\n{'grid per rank':>13s} {'structure':13s} {'lax.psum us':>11s} "
        f"{'llar.auto us':>12s} {'ratio':>6s} {'iterations':>10s} {'identical':>9s}")
  by_key = {(r["points_per_rank"], r["structure"], r["impl"]): r for r in rows}
  for rec in records:
    for name, v in rec["structures"].items():
      a = by_key[(rec["points_per_rank"], name, "lax.psum")]["value"]
      c = by_key[(rec["points_per_rank"], name, "llar.auto")]["value"]
      print(f"{rec['n']:>11d}^3 {name:13s} {a:11.2f} {c:12.2f} {a / c:6.2f} "
            f"{v['convergence']['llar.auto']['iterations']:10d} "
            f"{str(v['histories_identical']):>9s}")


def plot(rows: list[dict], path: str, title: str) -> None:
  """Per-iteration time against grid points per rank, log-log: one colour
  per impl, one line style per structure; saved as PNG at `path`.

  Raises:
    ImportError: when matplotlib is not installed.
  """
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  structures = list(dict.fromkeys(r["structure"] for r in rows))
  styles = ("-", "--", ":", "-.")
  fig, ax = plt.subplots(figsize=(6.5, 4.5))
  for si, st in enumerate(structures):
    for ii, impl in enumerate(IMPLS):
      pts = sorted((r["points_per_rank"], r["value"]) for r in rows
                   if r["impl"] == impl and r["structure"] == st)
      if pts:
        ax.plot([p[0] for p in pts], [max(p[1], 1e-2) for p in pts], marker="o",
                linestyle=styles[si % len(styles)], color=f"C{ii}", label=f"{impl} ({st})")
  ax.set_xscale("log", base=2)
  ax.set_yscale("log")
  sizes = sorted({r["points_per_rank"] for r in rows})
  ax.set_xticks(sizes, [f"{round(v ** (1 / 3))}^3" for v in sizes])
  ax.minorticks_off()
  ax.set_xlabel("grid points per rank")
  ax.set_ylabel("us per CG iteration")
  ax.set_title(title, fontsize=10)
  ax.grid(True, which="both", alpha=0.3)
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main() -> int:
  t0 = time.perf_counter()
  if not host.gpu_present():
    changed = host.use_cpu(CPU_DEVICES.value)
    if changed:
      print("no GPU here: running on forced CPU devices (" + ", ".join(changed) + ")",
            flush=True)
  grids = GRIDS.value or (GPU_GRIDS if host.gpu_present() else CPU_GRIDS)
  out = run(Settings(
      grids=tuple(int(g) for g in grids),
      structures=tuple(st for st in cg.STRUCTURES if st in STRUCTURE.value),
      k=K.value, halo=HALO.value, iters=(int(ITERS.value[0]), int(ITERS.value[1])),
      calls=CALLS.value, rounds=ROUNDS.value, tol=TOL.value, max_iters=MAX_ITERS.value,
      ranks=RANKS.value, single_device_check=SINGLE.value))
  result = {"env": report.environment(), "level": "app",
            "command": "python examples/cg_solver/main.py " + " ".join(sys.argv[1:]),
            "rows": out.pop("rows"), "cg": out, "elapsed_s": time.perf_counter() - t0}
  print_summary(result["rows"], out["grids"])
  if JSON.value:
    path = JSON.value
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
      json.dump(result, f, indent=1)
  else:  # never overwrites: report.save picks an unused name
    path = report.save(result, OUT.value, report.stem("app", "-cg" + TAG.value))[0]
  saved = [path]
  try:
    png = os.path.splitext(path)[0] + ".png"
    plot(result["rows"], png, f"CG on 3-D Poisson, {out['ranks']} x {out['device_kind']}, "
         f"halo {out['settings']['halo']}")
    saved.append(png)
  except ImportError:
    print("matplotlib is not installed: no plot (pip install 'jax_llar[bench]')",
          file=sys.stderr)
  print(f"\nsaved {', '.join(saved)} ({result['elapsed_s']:.0f} s in all)")
  print("all checks passed" if out["ok"] else "SOME CHECKS FAILED")
  return 0 if out["ok"] else 1


if __name__ == "__main__":
  _cli.run(main)
