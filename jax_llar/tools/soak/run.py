"""The soak's loops and its tally (the command line: jax_llar.tools.soak,
whose module docstring describes the modes and the record)."""

from __future__ import annotations

import dataclasses
import math
import time
from collections import Counter
from typing import Callable, Sequence

import ml_dtypes
import numpy as np

from jax_llar import algorithms, testing
from jax_llar.tools import host

# A soak whose first this many cases (or programs) were all skipped ends as a
# failure instead of drawing for ever.
MAX_SKIPPED_BEFORE_ANY = 1000

NP_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16),
             "float16": np.dtype(np.float16), "int32": np.dtype(np.int32)}


@dataclasses.dataclass
class Tally:
  """What a soak has checked so far, and its first failure.

  run_loopback and run_jax fill it in; jax_llar.tools.soak prints its
  progress and saves record() as the soak's result.

  Attributes:
    requested: calls to check (a call: one all-reduce on all ranks).
    checked: calls checked so far (add()).
    mismatches: loopback: cases, jax: psums of a program step, whose output
      differed from the reference in at least one bit on at least one rank.
    by_algorithm, by_dtype, by_world: calls checked per algorithm short
      name, dtype name and world size (the key a str).
    skipped: cases or programs skipped, per reason ("<algorithm>: <why>").
    units: cases (loopback) or programs (jax) run or skipped.
    max_seconds: wall time, seconds, after which the soak stops unfinished
      (stopped_early); math.inf (the default) never stops it.
    stopped_early: set by `done` when max_seconds ran out before `requested`
      calls were checked.
    failure: the first failure (a failed or short case's row, the error of a
      failed call, or why nothing could run), None while there is none.
    first_mismatch: where the first wrong sum was (algorithm, dtype, rank,
      call or step ...), None while there is none.
    started: time.perf_counter() when the tally was made, seconds.
    last_print: time.perf_counter() of the last progress line, seconds.

  Example:
    >>> t = Tally(1000)
    >>> t.add(250, "one_shot_ll", "float32", 2)
    >>> t.done, t.record()["calls_checked"], t.record()["passed"]
    (False, 250, False)
  """
  requested: int
  checked: int = 0
  mismatches: int = 0
  by_algorithm: Counter = dataclasses.field(default_factory=Counter)
  by_dtype: Counter = dataclasses.field(default_factory=Counter)
  by_world: Counter = dataclasses.field(default_factory=Counter)
  skipped: Counter = dataclasses.field(default_factory=Counter)  # reason -> count
  units: int = 0          # programs or cases run
  max_seconds: float = math.inf  # stop (unfinished) after this long
  stopped_early: bool = False
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
    if time.perf_counter() - self.started > self.max_seconds and not self.stopped_early:
      self.stopped_early = self.checked < self.requested
    return self.checked >= self.requested or self.failure is not None or self.stopped_early

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
          f"{self.mismatches} mismatches, {elapsed:.0f} s elapsed, about {eta} left"
          f"{host.memory_note()}", flush=True)

  def record(self) -> dict:
    return {"calls_requested": self.requested, "calls_checked": self.checked,
            "mismatches": self.mismatches, "units": self.units,
            "calls_by_algorithm": dict(self.by_algorithm),
            "calls_by_dtype": dict(self.by_dtype),
            "calls_by_world_size": dict(self.by_world),
            "skipped": dict(self.skipped), "failure": self.failure,
            "stopped_at_max_seconds": self.stopped_early,
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

  Each case draws an algorithm, a dtype and a simulated world size uniformly
  from `algs`, `dtypes` and `worlds`, a payload per rank log-uniform up to
  min(`max_bytes`, the algorithm's limit) (log_uniform_size), and runs up to
  `calls_per_case` consecutive checked calls on the loopback harness
  (jax_llar.tools.loopback.harness), fewer when fewer calls are left or the
  outputs would pass 64 MiB. A case the harness skips (a dtype an algorithm
  does not serve, grids that are not co-resident), or refuses with a
  ValueError, is counted in tally.skipped by reason; when the first
  MAX_SKIPPED_BEFORE_ANY cases were all skipped, tally.failure says so. A
  case that fails, or checks fewer calls than it ran, sets tally.failure
  (and tally.mismatches and tally.first_mismatch when a sum was wrong) and
  ends the soak. Results go into `tally` only; nothing is returned.

  Args:
    tally: the tally to fill in; the loop runs until tally.done.
    algs: algorithm short names to mix (ones the harness simulates).
    dtypes: dtype names to mix (keys of loopback_harness.DTYPES).
    worlds: simulated world sizes to mix, 2..16.
    max_bytes: largest payload per rank, bytes.
    calls_per_case: consecutive calls per case, at most.
    sets: input sets per case (loopback_harness.Settings.sets).
    timeout_ms: the kernels' bound on every wait, milliseconds.
    rng: the source of every random choice (cases, seeds of their inputs).
    progress_s: seconds between progress lines (Tally.progress).
    run_case: runs one case, (module, Settings, Case, rng) -> row dict as
      loopback_harness.run_case returns it; None (the default) runs the
      harness itself on the native tools module. Tests pass a fake.

  Raises:
    RuntimeError: `run_case` is None and the native tools module cannot be
      loaded (jax_llar.tools._native.require).
    ValueError: a name in `algs` is not an algorithm's short name.
    KeyError: a name in `dtypes` is not a key of loopback_harness.DTYPES.
    Any other exception `run_case` raises propagates (the tally keeps what
    was checked before it).

  Example:
    >>> tally = Tally(10_000)
    >>> run_loopback(tally, ["one_shot_ll"], ["float32"], [2, 4], 262144, 4000,
    ...              4, 5000, np.random.default_rng(0), 10.0)  # doctest: +SKIP
    >>> tally.record()["passed"]  # doctest: +SKIP
    True
  """
  from jax_llar.tools.loopback import harness as lh
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
    try:
      row = run_case(mod, s, case, np.random.default_rng(s.seed))
    except ValueError as e:  # the harness refuses the case (a dtype not served)
      row = {"status": "skipped", "reason": str(e)}
    tally.units += 1
    if row["status"] == "skipped":
      tally.skipped[f"{alg}: {row.get('reason', 'skipped')}"] += 1
      if not tally.checked and tally.units >= MAX_SKIPPED_BEFORE_ANY:
        tally.failure = {"error": f"the first {tally.units} cases were all skipped "
                         "(dtypes, sizes or world sizes the algorithms do not serve here)",
                         "last": {k: v for k, v in row.items() if k != "plan"}}
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
  """Random programs until `tally` is done (see the module docstring).

  Each program is a jitted shard_map over every GPU (mesh axis "x") of
  `psums` jax_llar.psum calls, one algorithm drawn from `algs` forced
  (jax_level.forcing), one dtype drawn from `dtypes`, each psum's payload per
  rank log-uniform up to min(`max_bytes`, the algorithm's limit). It is
  compiled once; when the dispatch log shows that not every psum took the
  fast path with that algorithm, the program is skipped (tally.skipped, by
  reason) and, after 50 programs with no call checked, tally.failure says
  so. Otherwise the program runs up to `steps` steps over `sets` input sets
  (set 1: special values, set 2 for float dtypes: every NaN bit pattern and
  all-ones words), each psum's output on every rank compared bit for bit
  with testing.rank_order_sum; a call is one psum of one step. A wrong sum
  is counted (tally.mismatches, tally.first_mismatch) and the soak goes on;
  a call that raises (the bounded wait's error, a lost context) sets
  tally.failure, with jax_llar.error_reports(), and ends the soak. Every
  program is dropped and JAX's caches cleared (jax.clear_caches) before the
  next one. Results go into `tally` only; nothing is returned.

  Args:
    tally: the tally to fill in; the loop runs until tally.done.
    algs: algorithm short names to mix.
    dtypes: dtype names to mix (keys of NP_DTYPES).
    max_bytes: largest payload per rank and psum, bytes.
    psums: psums per program (mixed sizes).
    steps: steps each program runs, at most, before the next one.
    sets: input sets per program; step i uses set i % sets.
    rng: the source of every random choice (programs, inputs).
    progress_s: seconds between progress lines (Tally.progress).

  Raises:
    ValueError: a name in `algs` is not an algorithm's short name.
    KeyError: a name in `dtypes` is not a key of NP_DTYPES.
    An error while building or compiling a program (no GPU, say; the caller,
    jax_llar.tools.soak, checks for 2+ GPUs first) propagates; errors of
    the calls themselves are recorded in tally.failure instead.

  Example:
    >>> tally = Tally(100_000)
    >>> run_jax(tally, ["one_shot_ll", "two_shot_ll"], ["float32", "bfloat16"],
    ...         262144, 64, 500, 4, np.random.default_rng(0), 10.0)  # doctest: +SKIP
  """
  import jax
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

  import jax_llar
  from jax_llar.tools.bench import jax_level as jax_level
  from jax_llar.tools.loopback import harness as lh
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
    for i in range(sets):
      per = [np.stack([testing.random_array(rng, (n,), dtype) for _ in range(world)])
             for n in counts]
      # F1 on the real path: set 1 carries the loopback's special values, set
      # 2 (float dtypes) every NaN bit pattern and all-ones words (the
      # sentinel's collision) in every position of a line.
      if i == 1:
        per = [lh.special_set(rng, x) for x in per]
      elif i == 2 and dtype in lh.QUIET_BIT:
        per = [lh.nan_pattern_set(rng, x) for x in per]
      inputs.append([jax.device_put(x, sharding) for x in per])
      refs.append([testing.rank_order_sum(list(x), dtype) for x in per])
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
      if tally.units >= 50 and not tally.checked:
        tally.failure = {"error": "no program took the fast path", "last": why}
      continue
    tally.units += 1
    _run_program(tally, compiled, inputs, refs, alg, dtype, counts, steps, sets, psums,
                 world, progress_s)
    # Drop the program before the next one is compiled (JAX's caches would
    # keep every one, with device memory outside XLA's pool).
    del compiled, fn
    jax.clear_caches()
    if tally.failure is not None:
      return


def _run_program(tally, compiled, inputs, refs, alg, dtype, counts, steps, sets, psums,
                 world, progress_s) -> None:
  """Runs one compiled soak program for up to `steps` steps, checking every
  output (run_jax's inner loop); a failed call sets tally.failure."""
  import jax_llar
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
