"""The loopback harness's fused mode: the all-reduce + residual add + RMSNorm
kernel (``jax_llar.psum_add_rms_norm``'s) with W ranks simulated on ONE GPU.

The native side is ``jax_llar.tools._llar_tools.loopback_add_rms_norm``
(``ffi/tools/loopback_add_rms_norm.h`` in the repository): the set-up of the
all-reduce's loopback harness, the production launcher of the fused kernel
once per rank and call, each rank on a stream of its own, and before every
fused call a one-shot all-reduce of x (another grid on the same epoch
counters and scratch, as under XLA). This module makes the inputs, runs the
cases and checks them against `emulate`, the reference's meaning
(`jax_llar.fused.reference`) computed on the host: new_residual bitwise;
normed within NORMED_MAX_ULP units in the last place (the kernel sums the
squares in its own order and uses the GPU's approximate reciprocal square
root, the emulation float64 and an exact one); every rank's outputs bitwise
identical; every epoch counter advanced once per call of its warp; no error
record. The command line is ``python -m jax_llar.tools.loopback --op
add_rms_norm``.

What this tests and what not: as the all-reduce's loopback harness, the
protocol logic and the kernel's arithmetic (here also its thread block
cluster reduction), not NVLink, and no speed.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import ml_dtypes
import numpy as np

from jax_llar import _ext, testing
from jax_llar.tools import _native, report
from jax_llar.tools.loopback import harness as lh

IMPL = "loopback.add_rms_norm"
NOTE = ("loopback harness, fused all-reduce + residual add + RMSNorm: all ranks "
        "simulated on one GPU; tests the protocol logic and the kernel's "
        "arithmetic, not NVLink (every store is local), and measures no speed")
EPS = 1e-6

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
DTYPES = {"float32": F32, "bfloat16": BF16, "float16": F16,
          "f32": F32, "bf16": BF16, "f16": F16}

# normed against `emulate`, in units in the last place of x's dtype. For
# 16-bit dtypes the float32 differences never reach a unit of the dtype
# twice; for float32 they are the approximate reciprocal square root
# (relative error below 2^-22.9, about two units), the summation order of
# the squares and two roundings.
NORMED_MAX_ULP = {F32: 8, BF16: 1, F16: 1}

DEFAULT_SHAPES = ((1, 64), (2, 64), (8, 64), (32, 64), (1, 2048), (2, 2048), (8, 2048),
                  (32, 2048), (1, 4096), (2, 4096), (8, 4096), (32, 4096), (1, 640),
                  (3, 5120), (4, 7168), (64, 64), (1, 16384))


def emulate(xs: Sequence[np.ndarray], residual: np.ndarray, weight: np.ndarray,
            eps: float, dtype) -> tuple[np.ndarray, np.ndarray]:
  """`jax_llar.fused.reference`'s meaning on the host: (normed, new_residual)
  in `dtype`.

  new_residual is exact: the psum of `xs` (every rank's x, rank order) as
  the fast path promises it (a float64 sum in rank order rounded once), plus
  the residual in float32, rounded once. normed is computed from it in
  float64 and rounded to float32 where the kernel rounds (the mean square
  plus eps, its reciprocal square root, h * inv, then times the weight), then
  to `dtype`.
  """
  dtype = np.dtype(dtype)
  psum = testing.rank_order_sum([np.asarray(x) for x in xs], dtype)
  with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
    new_residual = (psum.astype(np.float32) +
                    np.asarray(residual).astype(np.float32)).astype(dtype)
    h = new_residual.astype(np.float32)
    squares = np.sum(h.astype(np.float64) ** 2, axis=-1, keepdims=True)
    inv_d = np.float32(1.0) / np.float32(h.shape[-1])
    mean_eps = (squares.astype(np.float32).astype(np.float64) * np.float64(inv_d) +
                np.float64(np.float32(eps))).astype(np.float32)
    inv = (1.0 / np.sqrt(mean_eps.astype(np.float64))).astype(np.float32)
    normed = ((h * inv).astype(np.float32) *
              np.asarray(weight).astype(np.float32)).astype(np.float32)
  return normed.astype(dtype), new_residual


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """|a - b| in units in the last place of their common 16- or 32-bit float
  dtype, elementwise: the number of representable values between them (0 for
  equal values, +0 and -0 included, and where both are NaN; 2^40 where only
  one is NaN)."""
  a = np.asarray(a)
  b = np.asarray(b)
  if a.dtype != b.dtype or a.shape != b.shape:
    raise ValueError(f"ulp_distance: {a.dtype}{list(a.shape)} and "
                     f"{b.dtype}{list(b.shape)} differ")
  bits = {2: np.uint16, 4: np.uint32}[a.dtype.itemsize]
  width = 8 * a.dtype.itemsize

  def ordered(v):
    u = v.view(bits).astype(np.int64)
    mag = u & ((1 << (width - 1)) - 1)
    return np.where((u >> (width - 1)) == 1, -mag, mag)

  dist = np.abs(ordered(a) - ordered(b))
  nan_a = np.isnan(a.astype(np.float32))
  nan_b = np.isnan(b.astype(np.float32))
  dist = np.where(nan_a & nan_b, 0, dist)
  return np.where(nan_a ^ nan_b, np.int64(1) << 40, dist)


@dataclasses.dataclass(frozen=True)
class Case:
  """One cell of the matrix: `world` ranks, x (rows, d) of `dtype`, a
  weight of `weight` (x's dtype or float32)."""
  world: int
  dtype: str
  weight: str
  rows: int
  d: int
  start_epoch: int = 0

  @property
  def np_dtype(self) -> np.dtype:
    return DTYPES[self.dtype]


def cases(worlds: Sequence[int], dtypes: Sequence[str], shapes: Sequence[tuple[int, int]],
          start_epochs: Sequence[int]) -> list[Case]:
  """Every case in run order; 16-bit dtypes with a weight of their own dtype
  and a float32 one."""
  out = []
  for world in worlds:
    for dtype in dtypes:
      weights = [dtype] if DTYPES.get(dtype) == F32 else [dtype, "float32"]
      for weight in weights:
        for rows, d in shapes:
          for e in start_epochs:
            out.append(Case(world, dtype, weight, rows, d, e))
  return out


def skip_reason(case: Case) -> str | None:
  """Why the fused kernel does not serve `case`, or None."""
  if case.dtype not in DTYPES:
    return f"{case.dtype}: the fused kernel serves float32, bfloat16 and float16"
  mod = _ext.load(quiet=True)
  if mod is not None and mod.add_rms_norm_grid(case.rows, case.d,
                                               case.np_dtype.itemsize) is None:
    return f"{case.rows} x {case.d} {case.dtype} is not served (grid rule)"
  return None


def make_inputs(rng: np.random.Generator, case: Case):
  """x of every rank (world, rows, d), residual (rows, d), weight (d,):
  standard normals, the weight a gain near 1."""
  dtype, wdtype = case.np_dtype, DTYPES[case.weight]
  x = rng.standard_normal((case.world, case.rows, case.d)).astype(np.float32).astype(dtype)
  residual = rng.standard_normal((case.rows, case.d)).astype(np.float32).astype(dtype)
  weight = (1 + 0.1 * rng.standard_normal((case.d,))).astype(np.float32).astype(wdtype)
  return x, residual, weight


def _row(case: Case, calls: int) -> dict:
  return {"impl": IMPL, "world_size": case.world, "dtype": case.dtype,
          "weight_dtype": case.weight, "rows": case.rows, "d": case.d,
          "bytes_per_rank": case.rows * case.d * case.np_dtype.itemsize
                            if case.dtype in DTYPES else 0,
          "start_epoch": case.start_epoch, "calls": calls, "status": "error",
          "correct": False}


def run_case(mod: Any, case: Case, calls: int, timeout_ms: int, device: int,
             rng: np.random.Generator) -> dict:
  """Runs one case on the native harness and checks it; returns its row
  (status "pass", "fail", "skipped" or "error"; plan, normed_max_ulp, and
  as they apply reason, cuda_error, records, epoch_mismatch)."""
  row = _row(case, calls)
  x, residual, weight = make_inputs(rng, case)
  codes = mod.DTYPE_CODES
  try:
    r = mod.loopback_add_rms_norm(
        case.world, codes[str(case.np_dtype)], codes[str(DTYPES[case.weight])], case.rows,
        case.d, EPS, x.tobytes(), residual.tobytes(), weight.tobytes(), calls=calls,
        interleave=True, timeout_ms=float(timeout_ms), start_epoch=case.start_epoch,
        ordinal=device)
  except ValueError as e:
    row["status"] = "skipped" if "do not fit" in str(e) else "error"
    row["reason"] = str(e)
    return row
  row["plan"] = dict(r["plan"])
  records = [dict(rec) for rec in r["records"] if rec["code"]]
  if records:
    row["records"] = records
  if r["cuda_error"] is not None:
    row["cuda_error"] = r["cuda_error"]
    row["deadline_exceeded"] = r["deadline_exceeded"]
    return row
  shape = (case.world, case.rows, case.d)
  normed = np.frombuffer(r["normed"], case.np_dtype).reshape(shape)
  new_residual = np.frombuffer(r["new_residual"], case.np_dtype).reshape(shape)
  want_normed, want_new_residual = emulate(list(x), residual, weight, EPS, case.np_dtype)
  problems = []
  for k in range(case.world):
    if not testing.bitwise_equal(new_residual[k], want_new_residual):
      where = np.argwhere(ulp_distance(new_residual[k], want_new_residual))[:3]
      problems.append(f"rank {k}: new_residual differs at {where.tolist()}")
    if normed[k].tobytes() != normed[0].tobytes():
      problems.append(f"rank {k}: normed differs from rank 0's")
  worst = int(ulp_distance(normed[0], want_normed).max())
  row["normed_max_ulp"] = worst
  if worst > NORMED_MAX_ULP[case.np_dtype]:
    problems.append(f"normed {worst} ulp from the emulation (at most "
                    f"{NORMED_MAX_ULP[case.np_dtype]})")
  row["epoch_mismatch"] = r["epoch_mismatch"]
  if not r["epochs_checked"] or r["epoch_mismatch"] is not None:
    problems.append(f"epochs: {r['epoch_mismatch']}")
  return verdict(row, problems, records)


def verdict(row: dict, problems: list[str], records: list[dict]) -> dict:
  """`row` with its verdict: "fail" (and its problems) when there are
  problems or error records (records kept in the row), else "pass"."""
  if records:
    row["records"] = records
    problems.append(f"{len(records)} error record(s)")
  row["status"] = "fail" if problems else "pass"
  row["correct"] = not problems
  if problems:
    row["problems"] = problems
  return row


def _line(row: dict) -> str:
  head = (f"W={row['world_size']:<2d} {row['dtype']:8s} w={row['weight_dtype']:8s} "
          f"{row['rows']:3d}x{row['d']:<6d} e0={row['start_epoch']:<10d} ")
  plan = row.get("plan")
  if plan:
    head += f"cluster {plan['cluster_blocks']}x{plan['threads']:<3d} "
  detail = ""
  if row["status"] == "pass":
    detail = f" normed <= {row['normed_max_ulp']} ulp"
  elif row.get("problems"):
    detail = " " + "; ".join(row["problems"][:3])
  elif row.get("cuda_error"):
    detail = f" {row['cuda_error']}"
  elif row.get("reason"):
    detail = f" {row['reason']}"
  return head + row["status"].upper() + detail


def run(worlds: Sequence[int], dtypes: Sequence[str], shapes: Sequence[tuple[int, int]],
        calls: int, timeout_ms: int, start_epochs: Sequence[int], seed: int,
        device: int) -> dict:
  """Runs every case, printing one line per case as it goes.

  Returns:
    ``{"env", "level": "loopback", "note", "settings", "rows"}``, rows as
    `run_case` makes them (and "skipped" / "not_run" rows with a reason).

  Raises:
    RuntimeError: when the native tools module is unavailable.
  """
  mod = _native.require("python -m jax_llar.tools.loopback --op add_rms_norm")
  rng = np.random.default_rng(seed)
  items = ((_row(case, calls), skip_reason(case),
            functools.partial(run_case, mod, case, calls, timeout_ms, device, rng),
            f"W={case.world} {case.dtype} {case.rows}x{case.d}")
           for case in cases(worlds, dtypes, shapes, start_epochs))
  rows = lh.run_cases(items, _line, total=sum(
      1 for _ in cases(worlds, dtypes, shapes, start_epochs)))
  settings = {"op": "add_rms_norm", "worlds": list(worlds), "dtypes": list(dtypes),
              "shapes": [list(s) for s in shapes], "calls": calls,
              "timeout_ms": timeout_ms, "start_epochs": list(start_epochs), "seed": seed,
              "device": device, "interleave": True, "eps": EPS}
  return {"env": report.environment(), "level": "loopback", "note": NOTE,
          "settings": settings, "rows": rows}


def parse_shapes(values: Sequence[str]) -> tuple[tuple[int, int], ...]:
  """``["1x4096", "8x2048"]`` -> ((1, 4096), (8, 2048)).

  Raises:
    ValueError: a value is not ROWSxD with positive integers.
  """
  out = []
  for v in values:
    parts = v.lower().split("x")
    try:
      rows, d = (int(p) for p in parts)
    except ValueError:
      raise ValueError(f"shapes must be ROWSxD, e.g. 8x4096: {v!r}") from None
    if rows < 1 or d < 1:
      raise ValueError(f"shapes must be positive: {v!r}")
    out.append((rows, d))
  return tuple(out)
