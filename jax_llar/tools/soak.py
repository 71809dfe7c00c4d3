"""Soak: millions of consecutive checked all-reduce calls, mixed sizes,
dtypes and algorithms, until one fails or the count is reached.

  python -m jax_llar.tools.soak --calls 2200000 [--mode jax|loopback]
      [--algorithms one_shot_ll,two_shot_ll] [--dtypes float32,bfloat16,float16,int32]
      [--max_bytes 262144] [--seed 0] [--json FILE]

Every call's output on every rank is compared bit for bit with the fast
path's promise, a float64 sum in rank order rounded once (NaNs by position:
jax_llar.testing), and every rank must hold the same bits. A wrong sum is
counted, never retried; a failed call (the bounded wait's error, a lost CUDA
context) ends the soak at once with its report. The goal of issue 12: at
least 2.2 million consecutive checked calls, no mismatch, no hang.

Modes:
  jax       (2+ GPUs) jitted shard_map programs of --psums_per_program
            jax_llar.psum calls of mixed sizes, each program compiled with one
            algorithm forced (the dispatch log must show that it ran; a
            program whose sizes the algorithm does not serve is skipped and
            said so), run over --sets input sets; a call is one psum of one
            program step, on all ranks. The real path: XLA, CUDA graphs,
            NVLink.
  loopback  (1 GPU) the loopback harness (jax_llar.tools.loopback): groups of
            2-16 ranks simulated on one GPU, random (algorithm, ranks,
            dtype, size, synchronised or not) cases of up to
            --calls_per_case consecutive calls, every call checked. The
            protocol logic and the reductions, not NVLink, not XLA.
  auto      jax with 2+ GPUs, else loopback.

A progress line every --progress_s seconds gives the calls checked, the
rate, the mismatches and an estimate of the time left. The final record
(level "soak"; --json, else OUT/<machine>-<yyyymmdd>-soak<tag>.json) holds
the calls checked per algorithm, dtype and world size, the mismatches, the
first failure and the wall time. Exit status 0 only when every requested
call was checked and none mismatched or failed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections import Counter
from typing import Any, Callable, Sequence

import ml_dtypes
import numpy as np
from absl import flags

from jax_llar import algorithms, testing
from jax_llar.tools import _cli, report

CALLS = flags.DEFINE_integer("calls", 2_200_000, "Checked all-reduce calls to run.",
                             lower_bound=1)
MODE = flags.DEFINE_enum("mode", "auto", ["auto", "jax", "loopback"],
                         "jax: real GPUs through XLA (2+ GPUs); loopback: ranks "
                         "simulated on one GPU; auto: jax with 2+ GPUs, else loopback.")
ALGORITHMS_F = flags.DEFINE_list("algorithms", [],
                                 "Algorithms to mix (short names; default: every one "
                                 "the mode can run).")
DTYPES_F = flags.DEFINE_list("dtypes", ["float32", "bfloat16", "float16", "int32"],
                             "Element types to mix.")
MAX_BYTES_F = flags.DEFINE_integer("max_bytes", 256 * 1024,
                                   "Largest payload per rank, bytes (each algorithm "
                                   "also stops at its own limit).", lower_bound=4)
WORLDS_F = flags.DEFINE_list("worlds", ["2", "3", "4", "8"],
                             "loopback: simulated world sizes to mix.")
CALLS_PER_CASE = flags.DEFINE_integer("calls_per_case", 4000,
                                      "loopback: consecutive calls per case, at most.",
                                      lower_bound=1)
PSUMS = flags.DEFINE_integer("psums_per_program", 64,
                             "jax: psums per program (mixed sizes).", lower_bound=1)
STEPS = flags.DEFINE_integer("steps_per_program", 500,
                             "jax: steps each program runs before the next one.",
                             lower_bound=1)
SETS = flags.DEFINE_integer("sets", 4, "Input sets per program or case; a call uses "
                            "one of them in turn.", lower_bound=1, upper_bound=64)
TIMEOUT_MS = flags.DEFINE_integer("timeout_ms", 5000, "The kernels' bound on every "
                                  "wait (loopback; jax: JAX_LLAR_TIMEOUT_MS).",
                                  lower_bound=1, upper_bound=600_000)
PROGRESS_S = flags.DEFINE_float("progress_s", 10.0, "Seconds between progress lines.")
SEED = flags.DEFINE_integer("seed", 0, "Seed of the random cases and inputs.")
JSON = flags.DEFINE_string("json", None, "Write the record to this file.")
OUT = flags.DEFINE_string("out", report.default_out_dir(), report.OUT_HELP)
TAG = flags.DEFINE_string("tag", "", "Suffix of the result file name.")

DTYPES = {"float32": "float32", "f32": "float32", "bfloat16": "bfloat16",
          "bf16": "bfloat16", "float16": "float16", "f16": "float16",
          "int32": "int32", "i32": "int32"}
NP_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16),
             "float16": np.dtype(np.float16), "int32": np.dtype(np.int32)}


@dataclasses.dataclass
class Tally:
  """What a soak has checked so far, and its first failure."""
  requested: int
  checked: int = 0
  mismatches: int = 0
  by_algorithm: Counter = dataclasses.field(default_factory=Counter)
  by_dtype: Counter = dataclasses.field(default_factory=Counter)
  by_world: Counter = dataclasses.field(default_factory=Counter)
  skipped: Counter = dataclasses.field(default_factory=Counter)  # reason -> count
  units: int = 0          # programs or cases run
  failure: dict | None = None
  first_mismatch: dict | None = None
  started: float = dataclasses.field(default_factory=time.perf_counter)
  last_print: float = 0.0

  def add(self, n: int, algorithm: str, dtype: str, world: int) -> None:
    self.checked += n
    self.by_algorithm[algorithm] += n
    self.by_dtype[dtype] += n
    self.by_world[str(world)] += n

  @property
  def done(self) -> bool:
    return self.checked >= self.requested or self.failure is not None

  def progress(self, every_s: float, force: bool = False) -> None:
    """Prints a progress line at most every `every_s` seconds."""
    now = time.perf_counter()
    if not force and now - self.last_print < every_s:
      return
    self.last_print = now
    elapsed = now - self.started
    rate = self.checked / elapsed if elapsed > 0 else 0.0
    left = (self.requested - self.checked) / rate if rate > 0 else math.inf
    eta = "?" if math.isinf(left) else f"{max(left, 0):.0f} s"
    print(f"soak: {self.checked:>10,d}/{self.requested:,d} calls checked "
          f"({100 * self.checked / self.requested:5.1f}%), {rate:,.0f} calls/s, "
          f"{self.mismatches} mismatches, {elapsed:.0f} s elapsed, about {eta} left",
          flush=True)

  def record(self) -> dict:
    return {"calls_requested": self.requested, "calls_checked": self.checked,
            "mismatches": self.mismatches, "units": self.units,
            "calls_by_algorithm": dict(self.by_algorithm),
            "calls_by_dtype": dict(self.by_dtype),
            "calls_by_world_size": dict(self.by_world),
            "skipped": dict(self.skipped), "failure": self.failure,
            "first_mismatch": self.first_mismatch,
            "seconds": time.perf_counter() - self.started,
            "passed": (self.checked >= self.requested and self.mismatches == 0
                       and self.failure is None)}


def log_uniform_size(rng: np.random.Generator, itemsize: int, limit: int) -> int:
  """A payload size in bytes, a whole number of elements, log-uniform from one
  element to `limit` bytes (so that small calls, the common case, dominate
  and every size class appears)."""
  hi = max(0.0, math.log2(max(limit, itemsize) / itemsize))
  n = int(2 ** rng.uniform(0.0, hi + 1.0))  # the top class clamps to the limit
  if rng.random() < 0.5:  # odd counts: tails and chunking remainders
    n = max(1, n - int(rng.integers(0, min(n, 7) + 1)))
  return min(n, limit // itemsize) * itemsize


# --- loopback mode ----------------------------------------------------------------


def run_loopback(tally: Tally, algs: Sequence[str], dtypes: Sequence[str],
                 worlds: Sequence[int], max_bytes: int, calls_per_case: int, sets: int,
                 timeout_ms: int, rng: np.random.Generator, progress_s: float,
                 run_case: Callable[..., dict] | None = None) -> None:
  """Random loopback cases until `tally` is done (see the module docstring).
  A case the harness skips (a dtype an algorithm does not serve, grids that
  are not co-resident) is counted in tally.skipped by reason; a failed one
  ends the soak."""
  from jax_llar.tools import loopback_harness as lh
  mod = None
  if run_case is None:
    from jax_llar.tools import _native
    mod = _native.require("python -m jax_llar.tools.soak --mode loopback")
    run_case = lh.run_case
  while not tally.done:
    alg = algs[int(rng.integers(len(algs)))]
    dtype = dtypes[int(rng.integers(len(dtypes)))]
    world = int(worlds[int(rng.integers(len(worlds)))])
    itemsize = np.dtype(lh.DTYPES[dtype]).itemsize
    limit = min(max_bytes, lh.max_bytes(alg))
    n_bytes = log_uniform_size(rng, itemsize, limit)
    out_cap = 64 << 20  # outputs held per case
    calls = max(1, min(calls_per_case, tally.requested - tally.checked,
                       out_cap // (world * n_bytes)))
    s = lh.Settings(worlds=(world,), dtypes=(dtype,), sizes=(n_bytes,), calls=calls,
                    sets=sets, specials=True, sync=bool(rng.random() < 0.5),
                    timeout_ms=timeout_ms, keep=0, max_output_bytes=out_cap,
                    seed=int(rng.integers(2**31)), algorithm=alg)
    case = lh.Case(world, dtype, n_bytes)
    row = run_case(mod, s, case, np.random.default_rng(s.seed))
    tally.units += 1
    if row["status"] == "skipped":
      tally.skipped[f"{alg}: {row.get('reason', 'skipped')}"] += 1
      if sum(tally.skipped.values()) > 1000 + 10 * tally.units // 2 and not tally.checked:
        tally.failure = {"error": "every case was skipped", "last": row}
      continue
    if row["status"] != "pass" or row.get("calls_checked") != calls:
      tally.failure = {k: v for k, v in row.items() if k != "plan"}
      tally.failure["algorithm"] = alg
      if row.get("first_mismatch") is not None:
        tally.mismatches += 1
        tally.first_mismatch = row["first_mismatch"]
      break
    tally.add(calls, alg, dtype, world)
    tally.progress(progress_s)


# --- jax mode ---------------------------------------------------------------------


def _program_sizes(rng, itemsize: int, limit: int, k: int) -> list[int]:
  return [log_uniform_size(rng, itemsize, limit) // itemsize for _ in range(k)]


def run_jax(tally: Tally, algs: Sequence[str], dtypes: Sequence[str], max_bytes: int,
            psums: int, steps: int, sets: int, rng: np.random.Generator,
            progress_s: float) -> None:
  """Random programs until `tally` is done (see the module docstring)."""
  import jax
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

  import jax_llar
  from jax_llar.tools import jax_level
  devices = [d for d in jax.devices() if d.platform == "gpu"]
  mesh = Mesh(np.array(devices), ("x",))
  world = len(devices)
  sharding = NamedSharding(mesh, P("x"))
  while not tally.done:
    alg = algorithms.Algorithm.from_short_name(algs[int(rng.integers(len(algs)))])
    dtype = NP_DTYPES[dtypes[int(rng.integers(len(dtypes)))]]
    limit = min(max_bytes, algorithms.MAX_BYTES[alg])
    counts = _program_sizes(rng, dtype.itemsize, limit, psums)

    def body(*xs):
      return tuple(jax_llar.psum(x, "x") for x in xs)

    fn = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("x"),) * psums,
                               out_specs=(P("x"),) * psums, check_vma=False))
    inputs, refs = [], []
    for _ in range(sets):
      per = [[testing.random_array(rng, (n,), dtype) for _ in range(world)] for n in counts]
      inputs.append([jax.device_put(np.stack(p), sharding) for p in per])
      refs.append([testing.rank_order_sum(p, dtype) for p in per])
    jax_llar.clear_dispatch_log()
    with jax_level.forcing(alg):
      compiled = fn.lower(*inputs[0]).compile()
    log = jax_llar.dispatch_log()
    ran = {d.algorithm for d in log}
    if not log or any(not d.fast for d in log) or ran != {alg}:
      why = sorted({f"{d.reason}: {d.detail}" for d in log if not d.fast}) or [
          f"ran {sorted(str(a) for a in ran)}"]
      tally.skipped[f"{alg.short_name} {dtype}: {why[0]}"] += 1
      tally.units += 1
      if tally.units > 50 and not tally.checked:
        tally.failure = {"error": "no program took the fast path", "last": why}
      continue
    tally.units += 1
    for step in range(steps):
      if tally.done:
        break
      i = step % sets
      try:
        outs = compiled(*inputs[i])
        got = [np.asarray(o) for o in outs]
      except Exception as e:  # the bounded wait's error, a lost context
        tally.failure = {"error": f"{type(e).__name__}: {e}"[:2000], "algorithm":
                         alg.short_name, "dtype": str(dtype), "step": step,
                         "error_reports": jax_llar.error_reports()}
        return
      bad = [(j, r) for j, g in enumerate(got) for r in range(world)
             if not testing.bitwise_equal(g[r], refs[i][j])]
      n = min(psums, tally.requested - tally.checked)
      if bad:
        tally.mismatches += len({j for j, _ in bad})
        if tally.first_mismatch is None:
          j, r = bad[0]
          tally.first_mismatch = {"algorithm": alg.short_name, "dtype": str(dtype),
                                  "elements": counts[j], "rank": r, "step": step,
                                  "psum": j}
      tally.add(n, alg.short_name, str(dtype), world)
      tally.progress(progress_s)


def main() -> int:
  from jax_llar.tools import loopback_harness as lh
  mode = MODE.value
  try:
    dtypes = [DTYPES[d] for d in DTYPES_F.value]
  except KeyError as e:
    print(f"jax_llar.tools.soak: unknown dtype {e.args[0]!r}; known: {', '.join(DTYPES)}")
    return 1
  import jax
  gpus = [d for d in jax.devices() if d.platform == "gpu"]
  if mode == "auto":
    mode = "jax" if len(gpus) >= 2 else "loopback"
  if mode == "jax" and len(gpus) < 2:
    print("jax_llar.tools.soak: --mode jax needs 2+ GPUs (found "
          f"{len(gpus)}); --mode loopback simulates the ranks on one GPU")
    return 1
  if mode == "loopback":
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", lh.MAX_CONNECTIONS)
    if not gpus:
      print("jax_llar.tools.soak: --mode loopback needs a CUDA GPU")
      return 1
  known = [a.short_name for a in algorithms.Algorithm]
  if mode == "loopback":
    known = [a for a in known if a in lh.ALGORITHMS]
  algs = list(ALGORITHMS_F.value) or known
  bad = [a for a in algs if a not in known]
  if bad:
    print(f"jax_llar.tools.soak: {mode} mode cannot run {', '.join(bad)}; it runs "
          f"{', '.join(known)}")
    return 1
  rng = np.random.default_rng(SEED.value)
  tally = Tally(CALLS.value)
  print(f"soak: {CALLS.value:,d} calls, mode {mode}, algorithms {', '.join(algs)}, "
        f"dtypes {', '.join(dtypes)}, up to {MAX_BYTES_F.value} bytes per rank", flush=True)
  if mode == "loopback":
    run_loopback(tally, algs, dtypes, [int(w) for w in WORLDS_F.value], MAX_BYTES_F.value,
                 CALLS_PER_CASE.value, SETS.value, TIMEOUT_MS.value, rng, PROGRESS_S.value)
  else:
    os.environ.setdefault("JAX_LLAR_TIMEOUT_MS", str(TIMEOUT_MS.value))
    run_jax(tally, algs, dtypes, MAX_BYTES_F.value, PSUMS.value, STEPS.value, SETS.value,
            rng, PROGRESS_S.value)
  tally.progress(0, force=True)
  rec = tally.record()
  out: dict[str, Any] = {"env": report.environment(), "level": "soak", "mode": mode,
                         "settings": {"algorithms": algs, "dtypes": dtypes,
                                      "max_bytes": MAX_BYTES_F.value, "seed": SEED.value,
                                      "worlds": WORLDS_F.value if mode == "loopback"
                                      else None},
                         **rec, "rows": []}
  if JSON.value:
    os.makedirs(os.path.dirname(os.path.abspath(JSON.value)), exist_ok=True)
    with open(JSON.value, "w") as f:
      json.dump(out, f, indent=1, default=str)
    path = JSON.value
  else:
    path = report.save(out, OUT.value, report.stem("soak", TAG.value))[0]
  verdict = "PASSED" if rec["passed"] else "FAILED"
  print(f"soak {verdict}: {rec['calls_checked']:,d} calls checked, {rec['mismatches']} "
        f"mismatches, failure: {rec['failure'] is not None}; saved {path}", flush=True)
  return 0 if rec["passed"] else 1


if __name__ == "__main__":
  _cli.run(main)
