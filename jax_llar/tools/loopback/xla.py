"""The loopback tool's XLA mode: cases through a loopback group inside jitted programs.

  python -m jax_llar.tools.loopback --op xla [--algorithm A] [--worlds 2,4]
      [--dtypes ...] [--sizes ...] [--calls N] [--shapes ROWSxD,...]

Per (world, dtype, size): one jitted program of `calls` calls of
`jax_llar.tools.loopback.group.LoopbackGroup.psum` (the production kernel of
--algorithm for every simulated rank, behind the loopback group's FFI custom
call), each call's input the previous call's output scaled exactly (floats
by 0.5, int32 shifted right by one), run twice on seeded random inputs
(the second run a replay of the first's executable, with other values);
every rank's output of both runs is compared bit for bit with the host's
rank-order emulation. With --algorithm one_shot_ll and float dtypes, also
the fused all-reduce + add + RMSNorm at each of --shapes (its loopback
target; new_residual bitwise, normed within loopback_fused.NORMED_MAX_ULP).
Cases whose grids cannot be resident together are skipped with the reason.
Rows: status "pass", "fail", "skipped" or "error", as the other modes' rows.
What it proves: the handler-shaped path inside XLA (docs/testing.md, "The
loopback group"); under compute-sanitizer (jax_llar.tools.sanitize's
"xla.loopback_group" unit), the loopback targets' kernels.
"""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np

from jax_llar import algorithms, testing
from jax_llar.tools.loopback import fused as lf
from jax_llar.tools.loopback import harness as lh
from jax_llar.tools import report

IMPL = "loopback_group"
NOTE = ("loopback group: all ranks simulated on one GPU behind an XLA FFI custom call, "
        "inside jitted programs; the JAX/XLA path and the protocol, not NVLink or speed")


def scaled(x: np.ndarray) -> np.ndarray:
  """The exact step between two calls of a case: floats halved, int32
  shifted right by one (arithmetic)."""
  if x.dtype == np.dtype(np.int32):
    return x >> 1
  return (x.astype(np.float64) * 0.5).astype(x.dtype)


def emulate(x: np.ndarray, calls: int) -> np.ndarray:
  """Every rank's output (world, n) of a case's program on x (world, n)."""
  for c in range(calls):
    x = np.broadcast_to(testing.rank_order_sum(list(x), x.dtype), x.shape)
    if c + 1 < calls:
      x = scaled(x)
  return np.ascontiguousarray(x)


def skip_reason(algorithm: str, dtype: str, nbytes: int) -> str | None:
  """Why a case is skipped before any device is asked, or None."""
  dt = lh.DTYPES[dtype]
  if nbytes % dt.itemsize:
    return f"{nbytes} bytes is not a whole number of {dtype} elements"
  refusal = algorithms.dtype_refusal(algorithms.Algorithm.from_short_name(algorithm), dt)
  if refusal is not None:
    return refusal
  if nbytes > algorithms.MAX_BYTES[algorithms.Algorithm.from_short_name(algorithm)]:
    return f"{nbytes} bytes exceed {algorithm}'s limit"
  return None


def _base_row(kind: str, world: int, dtype: str, nbytes: int, calls: int, algorithm: str,
              **extra) -> dict:
  return {"impl": f"{IMPL}.{kind}", "algorithm": algorithm, "world_size": world,
          "dtype": dtype, "bytes_per_rank": nbytes, "calls": calls, "status": "error",
          "correct": False, **extra}


def run_all_reduce(group, algorithm: str, dtype: str, nbytes: int, calls: int,
                   rng: np.random.Generator) -> dict:
  """One all-reduce case on `group`; returns its row."""
  import jax  # pylint: disable=g-import-not-at-top
  dt = lh.DTYPES[dtype]
  row = _base_row("all_reduce", group.world, dtype, nbytes, calls, algorithm)
  n = nbytes // dt.itemsize

  def program(x):
    for c in range(calls):
      x = group.psum(x, algorithm)
      if c + 1 < calls:
        x = x >> 1 if x.dtype == np.int32 else x * np.asarray(0.5, x.dtype)
    return x

  try:
    fn = jax.jit(program)
    problems = []
    for run in range(2):
      x = np.stack([testing.random_array(rng, (n,), dt) for _ in range(group.world)])
      got = np.asarray(fn(x))
      want = emulate(x, calls)
      for r in range(group.world):
        if not testing.bitwise_equal(got[r], want[r]):
          problems.append(f"run {run} rank {r}: differs from the rank-order emulation")
  except ValueError as e:
    row["status"] = "skipped" if "resident" in str(e) else "error"
    row["reason"] = str(e)
    return row
  return _finish(row, group, problems)


def run_add_rms_norm(group, dtype: str, rows: int, d: int, calls: int,
                     rng: np.random.Generator) -> dict:
  """One fused case on `group` (weight of x's dtype); returns its row."""
  import jax  # pylint: disable=g-import-not-at-top
  dt = lh.DTYPES[dtype]
  row = _base_row("add_rms_norm", group.world, dtype, rows * d * dt.itemsize, calls,
                  "one_shot_ll", rows=rows, d=d)
  try:
    fn = jax.jit(lambda a, b, c: group.add_rms_norm(a, b, c, lf.EPS))
    problems = []
    worst = 0
    for run in range(max(1, calls)):
      x = rng.standard_normal((group.world, rows, d)).astype(np.float32).astype(dt)
      residual = rng.standard_normal((rows, d)).astype(np.float32).astype(dt)
      weight = (1 + 0.1 * rng.standard_normal((d,))).astype(np.float32).astype(dt)
      normed, new_residual = (np.asarray(v) for v in fn(
          x, np.stack([residual] * group.world), weight))
      want_normed, want_residual = lf.emulate(list(x), residual, weight, lf.EPS, dt)
      for r in range(group.world):
        if not testing.bitwise_equal(new_residual[r], want_residual):
          problems.append(f"run {run} rank {r}: new_residual differs")
        worst = max(worst, int(lf.ulp_distance(normed[r], want_normed).max()))
      if worst > lf.NORMED_MAX_ULP[dt]:
        problems.append(f"run {run}: normed {worst} ulp from the emulation")
    row["normed_max_ulp"] = worst
  except ValueError as e:
    row["status"] = "skipped" if "resident" in str(e) else "error"
    row["reason"] = str(e)
    return row
  return _finish(row, group, problems)


def _finish(row: dict, group, problems: list[str]) -> dict:
  return lf.verdict(row, problems, [dict(r) for r in group.records() if r["code"]])


def _line(row: dict) -> str:
  what = (f"{row['rows']}x{row['d']}" if "d" in row else f"{row['bytes_per_rank']} B")
  tail = row.get("reason") or "; ".join(row.get("problems", [])) or ""
  return (f"{row['impl']:27s} W={row['world_size']} {row['dtype']:9s} {what:>10s} "
          f"{row['status'].upper():7s} {tail}")


def run(algorithm: str, worlds: Sequence[int], dtypes: Sequence[str], sizes: Sequence[int],
        shapes: Sequence[tuple[int, int]], calls: int, timeout_ms: int, seed: int,
        device: int) -> dict:
  """Runs every case, printing one line per case as it goes.

  Returns:
    ``{"env", "level": "loopback", "note", "settings", "rows"}``.

  Raises:
    RuntimeError: no CUDA device or no native tools module (the reason).
  """
  import jax  # pylint: disable=g-import-not-at-top
  from jax_llar.tools.loopback.group import LoopbackGroup  # pylint: disable=g-import-not-at-top
  dev = jax.devices("cuda")[device]
  rng = np.random.default_rng(seed)
  fused = algorithm == "one_shot_ll"
  rows: list[dict] = []
  for world in worlds:
    with LoopbackGroup(world, algorithms=(algorithm,), timeout_ms=timeout_ms,
                       device=dev) as group:
      items = []
      for dtype in dtypes:
        for nbytes in sizes:
          base = _base_row("all_reduce", world, dtype, nbytes, calls, algorithm)
          items.append((base, skip_reason(algorithm, dtype, nbytes),
                        functools.partial(run_all_reduce, group, algorithm, dtype, nbytes,
                                          calls, rng),
                        f"W={world} {dtype} {nbytes} B"))
        if fused and dtype in lf.DTYPES and dtype != "int32":
          for r, d in shapes:
            base = _base_row("add_rms_norm", world, dtype, 0, calls, "one_shot_ll")
            items.append((base, None,
                          functools.partial(run_add_rms_norm, group, dtype, r, d, calls, rng),
                          f"W={world} {dtype} {r}x{d}"))
      rows += lh.run_cases(items, _line, total=len(items))
  settings = {"op": "xla", "algorithm": algorithm, "worlds": list(worlds),
              "dtypes": list(dtypes), "sizes": list(sizes),
              "shapes": [list(s) for s in shapes], "calls": calls, "timeout_ms": timeout_ms,
              "seed": seed, "device": device}
  return {"env": report.environment(), "level": "loopback", "note": NOTE,
          "settings": settings, "rows": rows}
