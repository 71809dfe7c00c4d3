"""The loop level: the per-step time of one psum step in each loop structure.

The step is the JAX level's ``x = op(x) * f[axis_index]`` (`jax_level`), run
K times inside a ``jax.shard_map`` over a one-axis mesh ``x`` in each of the
structures a user writes for a loop:

  chain            a Python-unrolled straight line (the reference)
  scan             ``lax.scan`` of one step, unroll 1
  scan_unroll8     ``lax.scan`` of one step, ``unroll=8``
  fori             ``lax.fori_loop(0, K, ...)`` of one step (static bounds:
                   JAX lowers it to a scan, unroll 1)
  fori_k8          ``lax.fori_loop(0, K // 8, ...)`` whose body does 8 steps
  while            ``lax.while_loop`` on a counter ``i < K``
  while_psum_pred  ``lax.while_loop`` whose predicate also reads a scalar
                   all-reduce of the state, ``op(sum(x * x)) >= 0`` with the
                   same op, as a solver's convergence test does (always true,
                   but XLA cannot know the trip count)
  jit_step         a Python loop calling a jitted one-step ``shard_map`` whose
                   argument is donated (off GPUs each call is waited for)

and with each implementation of ``op`` (stable impl names):

  lax.psum   XLA's all-reduce (NCCL on GPUs)
  llar.auto  ``jax_llar.psum`` (the one-shot LL kernel where it applies)
  ffi.copy   the copy custom call (`jax_llar.tools.copy`): XLA's own cost of
             a custom-call step in that structure
  none       no collective: the step is the multiply alone, so the row is
             the loop's own cost (in the chain XLA fuses the multiplies)

Every program but ``jit_step`` is one ``jax.jit`` whose argument is not
donated, as at the JAX level. A call has a fixed cost of its own, so the
per-step time is the slope ``(T(k_long) - T(k_short)) / (k_long - k_short)``
between the median wall times of whole calls (for ``jit_step``: of the
Python loop of K calls, from the first call until the result is ready),
timed in interleaved rounds in an order that rotates from round to round.
Rows also give ``ratio_to_chain``, the slope over the same impl's ``chain``
slope in the same run (None for ``none``, whose chain is fused away).

Correctness: before timing, every configuration runs its short program on
random data and the output is compared bitwise with the JAX level's
references (`jax_level.simulate`, `jax_level.references_for`: the rank
order for jax_llar's fast path and the copy, JAX's own one-step sums for
lax.psum) and with ``excess_f32_per_trip`` (``psum_excess_f32_per_trip``
for lax.psum): XLA's excess precision within one trip of a loop, the state
rounded to the dtype where the loop carries it between trips. A jax_llar
row that fell back to lax.psum must equal the lax.psum program of the same
structure on the same inputs.

`run_flag_sets` repeats the run under each XLA flag set of `FLAG_SETS`, each
in a process of its own (XLA reads its flags when the backend starts). The
method is described in benchmarks/METHOD.md in the repository; what a trip
of a rolled loop costs and why, in the README section "Getting the speed in
loops".
"""

from __future__ import annotations

import dataclasses
import functools
import os
import statistics
import sys
import time
from typing import Callable, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_llar
from jax_llar import testing
from jax_llar.tools import copy as copy_call, report
from jax_llar.tools.bench import jax_level as jax_level
from jax_llar.tools.progress import Progress

STRUCTURES = ("chain", "scan", "scan_unroll8", "fori", "fori_k8", "while",
              "while_psum_pred", "jit_step")
IMPLS = ("lax.psum", "llar.auto", copy_call.IMPL_COPY, "none")
# Steps per trip of the structures that do several (the chain lengths must be
# multiples of it).
UNROLL = 8
DEFAULT_SIZES = (1024, 16384)
DEFAULT_DTYPES = ("bf16",)
DEFAULT_K_SHORT = 32
DEFAULT_K_LONG = 256
DEFAULT_CALLS = 60
DEFAULT_ROUNDS = 6

# The reference models added to the JAX level's (see `expected`): the
# second with JAX's own sums (lax.psum's, as `jax_level.PSUM_EXCESS_F32`).
EXCESS_PER_TRIP = "excess_f32_per_trip"
PSUM_EXCESS_PER_TRIP = "psum_excess_f32_per_trip"

# XLA flag sets of --loop_flags: (name, flags appended to XLA_FLAGS). Each one
# targets a part of what a trip of a rolled loop costs on the GPU runtime.
FLAG_SETS = (
    # The process's own XLA_FLAGS, nothing added: a while loop runs on the
    # host (WhileThunk), its body op by op unless it has at least
    # xla_gpu_graph_min_graph_size commands; a predicate whose trip count XLA
    # cannot derive is copied to the host and waited for on every trip.
    ("default", ""),
    # While loops become commands of the CUDA graph (a conditional WHILE node:
    # the loop runs on the device, predicate included), when every command of
    # the body and condition may be in a command buffer (custom calls with the
    # command-buffer trait: yes; NCCL collectives: not unless COLLECTIVES).
    ("cmdbuf_while", "--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL"),
    # As above, and a while command whose trip count is known is recorded as
    # that many copies of its body (a straight line in the graph).
    ("cmdbuf_while_unroll",
     "--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL "
     "--xla_gpu_command_buffer_unroll_loops=true"),
    # The HLO pass unrolls every loop with a known trip count completely (the
    # default, AUTO_UNROLL, unrolls by two only loops that contain an HLO
    # collective, which a custom call is not).
    ("while_full_unroll",
     "--xla_gpu_enable_while_loop_unrolling=WHILE_LOOP_UNROLLING_FULL_UNROLL"),
    # Any run of commands forms a command buffer, so a short loop body (and a
    # one-step program) is one graph launch per trip instead of a launch per
    # kernel.
    ("min_graph_1", "--xla_gpu_graph_min_graph_size=1"),
    # As cmdbuf_while, with NCCL collectives in the graph too: the fair
    # baseline for lax.psum in a device-side loop. Last: NCCL kernels inside a
    # conditional node are the least tried part of XLA's runtime here.
    ("cmdbuf_while_collectives",
     "--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL,+COLLECTIVES"),
)
FLAG_SET_NAMES = tuple(name for name, _ in FLAG_SETS)


@dataclasses.dataclass(frozen=True)
class Settings:
  """What one loop-level run measures.

  Attributes:
    impls: impl names (`IMPLS`).
    structures: loop structures (`STRUCTURES`).
    sizes: payload bytes per rank.
    dtypes: keys of `jax_level.DTYPES`.
    k_short, k_long: the two step counts, multiples of `UNROLL`.
    calls: timed calls per step count and configuration, over `rounds`.
    rounds: interleaved timing rounds.
    world: devices to use (0: all).
    seed: seed of the random inputs.
    flag_sets: names of `FLAG_SETS` to run in child processes after this
      process's own run (``default`` is this process; empty: none).
    flag_timeout_s: seconds allowed per child.
  """
  impls: tuple[str, ...] = IMPLS
  structures: tuple[str, ...] = STRUCTURES
  sizes: tuple[int, ...] = DEFAULT_SIZES
  dtypes: tuple[str, ...] = DEFAULT_DTYPES
  k_short: int = DEFAULT_K_SHORT
  k_long: int = DEFAULT_K_LONG
  calls: int = DEFAULT_CALLS
  rounds: int = DEFAULT_ROUNDS
  world: int = 0
  seed: int = 0
  flag_sets: tuple[str, ...] = ()
  flag_timeout_s: int = 900


def step_op(impl: str) -> Callable[[jax.Array], jax.Array]:
  """The collective of `impl` over mesh axis ``x``; the identity for
  ``none``.

  Raises:
    ValueError: for an unknown impl name.
  """
  if impl == "none":
    return lambda x: x
  if impl not in IMPLS:
    raise ValueError(f"unknown impl {impl!r}; known: {', '.join(IMPLS)}")
  return jax_level.op(impl)


def steps_per_trip(structure: str, k: int) -> int:
  """How many steps one trip of `structure`'s loop does (K for the chain:
  one program, no loop)."""
  if structure == "chain":
    return k
  return UNROLL if structure in ("scan_unroll8", "fori_k8") else 1


def _body(structure: str, step, f, k: int):
  """The K-step function of `structure` inside the shard_map."""

  def one(x):
    return step(x) * f

  def eight(_, x):
    for _ in range(UNROLL):
      x = one(x)
    return x

  if structure == "chain":
    def chain(x):
      for _ in range(k):
        x = one(x)
      return x
    return chain
  if structure == "scan":
    return lambda x: lax.scan(lambda c, _: (one(c), None), x, None, length=k)[0]
  if structure == "scan_unroll8":
    return lambda x: lax.scan(lambda c, _: (one(c), None), x, None, length=k,
                              unroll=UNROLL)[0]
  if structure == "fori":
    return lambda x: lax.fori_loop(0, k, lambda _, c: one(c), x)
  if structure == "fori_k8":
    return lambda x: lax.fori_loop(0, k // UNROLL, eight, x)
  if structure == "while":
    return lambda x: lax.while_loop(lambda c: c[0] < k,
                                    lambda c: (c[0] + 1, one(c[1])), (0, x))[1]
  if structure == "while_psum_pred":
    def cond(c):
      i, x = c
      norm2 = step(jnp.sum(jnp.square(x.astype(jnp.float32))))
      return (i < k) & (norm2 >= 0.0)
    return lambda x: lax.while_loop(cond, lambda c: (c[0] + 1, one(c[1])), (0, x))[1]
  raise ValueError(f"unknown structure {structure!r}; known: {', '.join(STRUCTURES)}")


def program(structure: str, impl: str, mesh: Mesh, k: int, dtype) -> Callable:
  """`structure`'s K-step program of `impl`: a function of the sharded
  state (rank r's block is its vector) returning the state after K steps.
  For ``jit_step`` it is a Python loop over a jitted one-step program that
  donates its argument (so its argument is consumed)."""
  if k % steps_per_trip(structure, k):
    raise ValueError(f"{structure}: {k} steps is not a multiple of {UNROLL}")
  if structure != "jit_step":
    step = step_op(impl)
    table = jnp.asarray(jax_level.factors(mesh.size, dtype))

    def body(x):
      return _body(structure, step, table[lax.axis_index("x")], k)(x)

    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                                 check_vma=False))
  one_step = _one_step(impl, mesh, np.dtype(dtype).name)
  # Off GPUs every call is waited for: XLA:CPU runs a collective's ranks on a
  # shared thread pool, and many collective programs in flight can leave a
  # rank without a thread (a rendezvous that never completes).
  wait = mesh.devices.flat[0].platform != "gpu"

  def loop(x):
    for _ in range(k):
      x = one_step(x)
      if wait and not isinstance(x, jax.core.Tracer):
        x.block_until_ready()
    return x

  return loop


@functools.lru_cache(maxsize=None)
def _one_step(impl: str, mesh: Mesh, dtype_name: str) -> Callable:
  """The jitted one-step program of ``jit_step`` (donates its argument),
  shared by both step counts so that it is compiled once."""
  dtype = jax_level.DTYPES[dtype_name]
  step = step_op(impl)
  table = jnp.asarray(jax_level.factors(mesh.size, dtype))

  def body(x):
    return step(x) * table[lax.axis_index("x")]

  return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                               check_vma=False), donate_argnums=0)


def references_for(impl: str, structure: str, platform: str,
                   fast: bool | None) -> tuple[str, ...]:
  """The references a row may match, in the order they are tried: the JAX
  level's (`jax_level.references_for`; ``none`` as a copy off CUDA), plus
  ``excess_f32_per_trip`` wherever ``excess_f32`` applies to a loop."""
  refs = jax_level.references_for(
      copy_call.IMPL_COPY if impl == "none" else impl,
      "cpu" if impl == "none" else platform, fast)
  if jax_level.EXCESS_F32 in refs and structure != "chain":
    refs = refs + (EXCESS_PER_TRIP,)
  if jax_level.PSUM_EXCESS_F32 in refs and structure != "chain":
    refs = refs + (PSUM_EXCESS_PER_TRIP,)
  return refs


def expected(impl: str, structure: str, inputs: Sequence[np.ndarray], k: int, dtype,
             reference: str, sums: jax_level.SumFn | None = None
             ) -> list[np.ndarray] | None:
  """Host model of the program's output per rank under `reference` (not
  ``lax.psum``, which is a device run).

  The JAX level's models are `jax_level.simulate` of the K steps (``none``
  modelled as the copy, whose value is the identity; the ``psum_*`` models
  with `sums`, JAX's one-step all-reduce, `jax_level.psum_sums`);
  ``excess_f32_per_trip`` is ``excess_f32`` over the steps of one trip,
  then rounded to `dtype` (the loop carries its state in `dtype`), once per
  trip; ``psum_excess_f32_per_trip`` the same from ``psum_excess_f32``.
  None where a model does not apply (excess models at float32, ``psum_*``
  models without `sums`).
  """
  model_impl = copy_call.IMPL_COPY if impl == "none" else impl
  per_trip_model = {EXCESS_PER_TRIP: jax_level.EXCESS_F32,
                    PSUM_EXCESS_PER_TRIP: jax_level.PSUM_EXCESS_F32}.get(reference)
  if per_trip_model is None:
    return jax_level.simulate(model_impl, inputs, k, dtype, reference, sums)
  per_trip = steps_per_trip(structure, k)
  xs = list(inputs)
  for _ in range(k // per_trip):
    xs = jax_level.simulate(model_impl, xs, per_trip, dtype, per_trip_model, sums)
    if xs is None:
      return None
  return xs


def _match(out: np.ndarray, candidates: dict[str, Callable[[], list | None]],
           world: int) -> str | None:
  for name, make in candidates.items():
    expect = make()
    if expect is not None and all(testing.bitwise_equal(out[r], expect[r])
                                  for r in range(world)):
      return name
  return None


@dataclasses.dataclass
class _Config:
  structure: str
  impl: str
  host: np.ndarray          # concatenated inputs (fresh copies for jit_step)
  x: jax.Array
  f_short: Callable
  f_long: Callable
  donates: bool
  reference: str | None
  refs: tuple[str, ...]
  fast: bool | None
  ts: list = dataclasses.field(default_factory=list)
  tl: list = dataclasses.field(default_factory=list)
  slopes: list = dataclasses.field(default_factory=list)


def _time_once(cfg: _Config, fn, sharding) -> float:
  x = jax.device_put(cfg.host, sharding) if cfg.donates else cfg.x
  x.block_until_ready()
  t0 = time.perf_counter()
  fn(x).block_until_ready()
  return time.perf_counter() - t0


def measure(structures: Sequence[str], impls: Sequence[str], mesh: Mesh, dtype,
            nbytes: int, k_short: int, k_long: int, calls: int, rounds: int,
            rng: np.random.Generator) -> list[dict]:
  """Per-step time of every (structure, impl) at one size; one row each.

  Each configuration gets its own random inputs and is checked first. Then
  every program is run once more (a program compiled later may have
  evicted an earlier program's CUDA graphs), and `rounds` rounds follow; in
  each, every configuration times ``calls // rounds`` calls of the short
  program and as many of the long one, in an order that rotates between
  rounds. Per-step time = (median of all long calls - median of all short
  calls) / (k_long - k_short).

  Row keys: impl, structure, world_size, dtype, bytes_per_rank, us_per_call
  (the slope, microseconds per step), us_round_min / us_round_max /
  us_round_median, ratio_to_chain, steps_per_trip, k_short, k_long,
  calls_each, t_short_ms, t_long_ms, correct, reference, references_tried,
  fast_path (jax_llar rows; else None), xla_flags.
  """
  world = mesh.size
  n = max(1, nbytes // dtype.itemsize)
  sharding = NamedSharding(mesh, P("x"))
  platform = mesh.devices.flat[0].platform
  sums = jax_level.psum_sums(mesh)
  configs: list[_Config] = []
  for structure in structures:
    for impl in impls:
      inputs = [testing.random_array(rng, (n,), dtype) for _ in range(world)]
      host = np.concatenate(inputs)
      x = jax.device_put(host, sharding)
      donates = structure == "jit_step"
      f_short = program(structure, impl, mesh, k_short, dtype)
      f_long = program(structure, impl, mesh, k_long, dtype)
      out = np.asarray(f_short(jax.device_put(host, sharding) if donates else x))
      out = out.reshape(world, n)
      fast = (jax_level.took_fast_path(n * dtype.itemsize, dtype)
              if impl.startswith("llar.") else None)
      refs = references_for(impl, structure, platform, fast)
      candidates = {}
      for ref in refs:
        if ref == jax_level.LAX_PSUM:
          candidates[ref] = lambda s=structure, h=host: list(np.asarray(program(
              s, "lax.psum", mesh, k_short, dtype)(jax.device_put(h, sharding))
          ).reshape(world, n))
        else:
          candidates[ref] = lambda r=ref, s=structure, i=impl, ins=inputs: expected(
              i, s, ins, k_short, dtype, r, sums)
      configs.append(_Config(structure, impl, host, x, f_short, f_long, donates,
                             _match(out, candidates, world), refs, fast))
  for cfg in configs:  # warm-up after the last compilation
    for fn in (cfg.f_short, cfg.f_long):
      _time_once(cfg, fn, sharding)
  per_round = max(1, calls // rounds)
  for r in range(rounds):
    order = configs[r % len(configs):] + configs[: r % len(configs)]
    for cfg in order:
      ts = [_time_once(cfg, cfg.f_short, sharding) for _ in range(per_round)]
      tl = [_time_once(cfg, cfg.f_long, sharding) for _ in range(per_round)]
      cfg.ts += ts
      cfg.tl += tl
      cfg.slopes.append((statistics.median(tl) - statistics.median(ts)) /
                        (k_long - k_short))
  rows = []
  for cfg in configs:
    slope = (statistics.median(cfg.tl) - statistics.median(cfg.ts)) / (k_long - k_short)
    rows.append({
        "impl": cfg.impl, "structure": cfg.structure, "world_size": world,
        "dtype": str(dtype), "bytes_per_rank": n * dtype.itemsize,
        "us_per_call": slope * 1e6,
        "us_round_min": min(cfg.slopes) * 1e6, "us_round_max": max(cfg.slopes) * 1e6,
        "us_round_median": statistics.median(cfg.slopes) * 1e6,
        "ratio_to_chain": None,
        "steps_per_trip": steps_per_trip(cfg.structure, k_long),
        "k_short": k_short, "k_long": k_long, "calls_each": per_round * rounds,
        "t_short_ms": statistics.median(cfg.ts) * 1e3,
        "t_long_ms": statistics.median(cfg.tl) * 1e3,
        "correct": cfg.reference is not None, "reference": cfg.reference,
        "references_tried": list(cfg.refs), "fast_path": cfg.fast,
        "flag_set": "default", "xla_flags": os.environ.get("XLA_FLAGS", ""),
    })
  add_ratios(rows)
  return rows


def add_ratios(rows: list[dict]) -> None:
  """Sets each row's ``ratio_to_chain``: its slope over the slope of the
  ``chain`` row of the same impl, dtype, size and flag set; None for the
  ``none`` impl (its chain is fused away) and where the chain's slope is not
  positive."""
  chains = {(r["impl"], r["dtype"], r["bytes_per_rank"], r.get("flag_set")): r
            for r in rows if r["structure"] == "chain"}
  for r in rows:
    c = chains.get((r["impl"], r["dtype"], r["bytes_per_rank"], r.get("flag_set")))
    ok = c is not None and r["impl"] != "none" and c["us_per_call"] > 0
    r["ratio_to_chain"] = r["us_per_call"] / c["us_per_call"] if ok else None


def child_command(s: Settings, out_dir: str) -> list[str]:
  """The command line of one flag set's child: this level with the same
  impls, structures, sizes, dtypes, step counts, calls, rounds, world and
  seed, writing to `out_dir`."""
  return [sys.executable, "-m", "jax_llar.tools.bench", "--level=loop",
          "--impls=" + ",".join(s.impls), "--structures=" + ",".join(s.structures),
          "--sizes=" + ",".join(map(str, s.sizes)), "--dtypes=" + ",".join(s.dtypes),
          f"--k_short={s.k_short}", f"--k_long={s.k_long}", f"--calls={s.calls}",
          f"--rounds={s.rounds}", f"--world={s.world}", f"--seed={s.seed}",
          f"--out={out_dir}", "--tag=-flagchild"]


def run_flag_sets(s: Settings) -> tuple[list[dict], list[dict]]:
  """The run repeated under each of ``s.flag_sets`` but ``default``, each in a
  child process (`child_command`) with the set's flags appended to
  ``XLA_FLAGS``. Returns the rows (``flag_set`` and ``xla_flags`` set) and
  one record per failed child (flag set, flags, rc, output tail)."""
  rows, failures = [], []
  flags_of = dict(FLAG_SETS)
  for name in s.flag_sets:
    if name == "default":
      continue
    print(f"flag set {name}: XLA_FLAGS += {flags_of[name]}", flush=True)
    rc, tail, child, xla_flags = jax_level.run_flag_child(
        lambda out: child_command(s, out), flags_of[name], s.flag_timeout_s)
    # A child exits 1 when a row matched no reference; its rows still count.
    if child is None or rc not in (0, 1):
      failures.append({"flag_set": name, "xla_flags": xla_flags, "rc": rc,
                       "output_tail": tail})
      print(f"flag set {name}: child failed (rc={rc})\n{tail[-1500:]}", flush=True)
      continue
    for r in child["rows"]:
      r["flag_set"] = name
      r["xla_flags"] = xla_flags
      rows.append(r)
      print(_row_line(r), flush=True)
  return rows, failures


def _row_line(r: dict) -> str:
  ratio = "" if r["ratio_to_chain"] is None else f" x{r['ratio_to_chain']:.2f} of chain"
  note = ("  (negative slope: timing noise; use more steps or calls)"
          if r["us_per_call"] < 0 else "")
  return (f"[{r['flag_set']}] {r['structure']:16s} {r['impl']:10s} {r['dtype']:9s} "
          f"{r['bytes_per_rank']:7d} B {r['us_per_call']:8.2f} us/step "
          f"[{r['us_round_min']:.2f}, {r['us_round_max']:.2f}]{ratio} "
          f"correct={r['correct']} reference={r['reference']} "
          f"fast_path={r['fast_path']}{note}")


def run(s: Settings) -> dict:
  """Runs the loop level; prints one line per row as it goes.

  Returns:
    the result: ``{"env", "level": "loop", "rows", "flag_sets" (name ->
    flags, of the sets run), "flag_failures", "dispatch"}`` (dispatch: the
    last 50 lowering decisions, as dicts).

  Raises:
    RuntimeError: with fewer than two devices.
    ValueError: when a step count is not a multiple of `UNROLL`, or for
      sizes, dtypes or a world `jax_level.settings_errors` refuses.
  """
  if s.k_short % UNROLL or s.k_long % UNROLL:
    raise ValueError(f"the step counts must be multiples of {UNROLL}")
  devices = jax.devices()
  if len(devices) < 2:
    raise RuntimeError("the loop level needs at least 2 devices")
  errors = jax_level.settings_errors(s.sizes, s.dtypes, s.world, len(devices))
  if errors:
    raise ValueError("; ".join(errors))
  mesh = Mesh(np.array(devices[: s.world or len(devices)]), ("x",))
  rng = np.random.default_rng(s.seed)
  rows = []
  progress = Progress(len(s.dtypes) * len(s.sizes), "loop level")
  for dt_name in s.dtypes:
    dtype = jax_level.DTYPES[dt_name]
    for nbytes in s.sizes:
      for row in measure(s.structures, s.impls, mesh, dtype, nbytes, s.k_short,
                         s.k_long, s.calls, s.rounds, rng):
        rows.append(row)
        print(_row_line(row), flush=True)
      progress.step(f"{dt_name} {nbytes} B")
  failures = []
  if s.flag_sets:
    flag_rows, failures = run_flag_sets(s)
    rows += flag_rows
  sets = {name: flags for name, flags in FLAG_SETS
          if name == "default" or name in s.flag_sets}
  return {"env": report.environment(), "level": "loop", "rows": rows,
          "flag_sets": sets, "flag_failures": failures,
          "dispatch": [d.to_dict() for d in jax_llar.dispatch_log()][-50:]}


# --- the loop level's table and plot ------------------------------------------

# Impl columns of the loop-level table, in this order.
LOOP_TABLE_IMPLS = ("lax.psum", "llar.auto", "ffi.copy", "none")


def _loop_groups(rows: list[dict]) -> dict:
  """(flag_set, dtype, bytes_per_rank) -> {(structure, impl): row}."""
  groups: dict = {}
  for r in rows:
    if "structure" not in r:
      continue
    key = (r.get("flag_set", "default"), r["dtype"], r["bytes_per_rank"])
    groups.setdefault(key, {})[(r["structure"], r["impl"])] = r
  return groups


def _ordered(values, order) -> list:
  return [v for v in order if v in values] + sorted(set(values) - set(order))


def print_loop_table(rows: list[dict], flag_sets: dict[str, str] | None = None) -> None:
  """Prints the loop-level tables: per flag set, dtype and size, one line
  per structure and one column per impl with its per-step slope and, in
  parentheses, the ratio to the same impl's chain; then, with more than one
  flag set, llar.auto and lax.psum per structure under each flag set."""
  groups = _loop_groups(rows)
  if not groups:
    return
  sets = _ordered({k[0] for k in groups}, FLAG_SET_NAMES)
  if flag_sets:
    print("XLA flag sets:")
    for name in sets:
      print(f"  {name:26s} {flag_sets.get(name) or '(none added)'}")
  for key in sorted(groups, key=lambda k: (sets.index(k[0]), k[1], k[2])):
    g = groups[key]
    impls = _ordered({i for _, i in g}, LOOP_TABLE_IMPLS)
    structures = _ordered({s for s, _ in g}, STRUCTURES)
    print(f"[{key[0]}] {key[1]} {key[2]} B per rank: us per step (ratio to chain)")
    print(f"{'structure':16s} " + " ".join(f"{i:>19s}" for i in impls))
    for s in structures:
      cells = []
      for i in impls:
        r = g.get((s, i))
        if r is None:
          cells.append(f"{'-':>19s}")
          continue
        ratio = f"({r['ratio_to_chain']:5.2f})" if r["ratio_to_chain"] is not None else " " * 7
        cells.append(f"{r['us_per_call']:8.2f} {ratio}{report.mark(r):2s}")
      print(f"{s:16s} " + " ".join(f"{c:>19s}" for c in cells))
  if len(sets) > 1:
    for impl in ("llar.auto", "lax.psum"):
      for dt, b in sorted({(k[1], k[2]) for k in groups}):
        print(f"{impl} {dt} {b} B per rank, us per step under each flag set:")
        w = max(12, *(len(n) for n in sets))
        print(f"{'structure':16s} " + " ".join(f"{n:>{w}s}" for n in sets))
        structures = _ordered({s for k, g in groups.items() for s, _ in g},
                              STRUCTURES)
        for s in structures:
          cells = []
          for n in sets:
            r = groups.get((n, dt, b), {}).get((s, impl))
            cells.append(f"{r['us_per_call']:{w - 2}.2f}{report.mark(r):2s}" if r else f"{'-':>{w}s}")
          print(f"{s:16s} " + " ".join(cells))
  print("(us per step: slope between the two step counts, median of all calls; "
        "ratio: over the same impl's chain in the same flag set; '!' = the result "
        "matched no reference; '*' = jax_llar fell back to lax.psum; while_psum_pred "
        "does two collectives per step, the step's and the predicate's)")


def plot_loop(rows: Iterable[dict], path: str, title: str) -> None:
  """Bar chart of a loop-level result: per-step time (log scale) per
  structure, one bar per impl, one panel per flag set, dtype and size;
  saved as PNG at `path`.

  Raises:
    ImportError: when matplotlib is not installed.
  """
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  groups = _loop_groups(list(rows))
  if not groups:
    return
  sets = _ordered({k[0] for k in groups}, FLAG_SET_NAMES)
  keys = sorted(groups, key=lambda k: (sets.index(k[0]), k[1], k[2]))
  ncols = min(2, len(keys))
  nrows = (len(keys) + ncols - 1) // ncols
  fig, axes = plt.subplots(nrows, ncols, figsize=(8 * ncols, 4 * nrows), squeeze=False)
  for ax in axes.flat[len(keys):]:
    ax.set_visible(False)
  for ax, key in zip(axes.flat, keys):
    g = groups[key]
    impls = _ordered({i for _, i in g}, LOOP_TABLE_IMPLS)
    structures = _ordered({s for s, _ in g}, STRUCTURES)
    width = 0.8 / max(1, len(impls))
    for j, impl in enumerate(impls):
      xs = [i + j * width for i in range(len(structures))]
      ys = [max(g[(s, impl)]["us_per_call"], 1e-2) if (s, impl) in g else 0
            for s in structures]
      ax.bar(xs, ys, width, label=impl)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(structures))])
    ax.set_xticklabels(structures, rotation=30, ha="right", fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("us per step")
    ax.set_title(f"{title} [{key[0]}] {key[1]} {key[2]} B", fontsize=9)
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=6)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
