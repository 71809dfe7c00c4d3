"""The JAX level: per-step time of jitted chains of all-reduces.

A chain is ``jax.jit`` of a ``jax.shard_map`` over a one-axis mesh ``x`` with
K dependent steps ``x = op(x) * f[axis_index]``, where ``op`` is the
implementation under test and ``f[r] = (r + 1) / (1 + 2 + ... + W)`` for W
ranks (dividing by the sum keeps long chains finite and non-zero). A jitted
call has a fixed cost of its own, so the per-step time is the slope
``(T(K_long) - T(K_short)) / (K_long - K_short)`` between the median wall
times of whole calls. Both chain lengths are timed in interleaved rounds; a
row reports the slope between the medians over all rounds (microseconds per
step) with the minimum and maximum of the per-round slopes.

Implementations (stable impl names):

  lax.psum            XLA's all-reduce (NCCL on GPUs)
  ffi.copy            a copy kernel behind the same FFI path as jax_llar: the
                      chain measures XLA's own cost per custom-call step
  llar.one_shot_ll    jax_llar.psum (on the one-shot LL kernel where it applies)
  diag.ffi_copy_wide  diagnostic, only when asked for: the copy kernel with a
                      208-byte parameter block
  lax.psum+<flag>     lax.psum with one XLA flag set, each flag in a process
                      of its own (XLA reads its flags when the backend starts)

Correctness: before timing, every configuration runs its short chain once
on random data and the output is compared bitwise with a reference that
models what the compiled program is allowed to do (`REFERENCES`, chosen per
row by `references_for`); the row records ``correct`` and ``reference``, the
name of the reference it matched (None when none did). Each implementation
is held to what it promises:

  jax_llar on its fast path, and the copy calls: the rank order, every
      step's sum the float64 rank-order sum rounded once
      (`jax_llar.testing.rank_order_sum`), bitwise.
  jax_llar that fell back to lax.psum: bitwise the lax.psum chain's output
      on the same inputs.
  lax.psum: bitwise the chain computed step by step on the host with every
      step's sum JAX's own, from a separate one-step lax.psum program run on
      that step's values in the same run (`psum_sums`). lax.psum promises no
      summation order (above two ranks XLA's CPU backend adds in float32,
      NCCL in its ring's order), so the rank-order model is not its
      contract; what is checked is that the chain applies the all-reduce and
      the multiplies K times as modelled, with the sums the same all-reduce
      gives. A wrong chain (a step lost, a wrong factor, a wrong sum) matches
      no reference.

The method is described in benchmarks/METHOD.md in the repository.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Iterator, Mapping, Sequence

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_llar
from jax_llar import testing
from jax_llar.algorithms import Algorithm
from jax_llar.tools import _native, copy as copy_call, report, traces
from jax_llar.tools.progress import Progress

LLAR = Algorithm.ONE_SHOT_LL.impl
IMPLS = ("lax.psum", copy_call.IMPL_COPY, LLAR)
DIAG_IMPLS = (copy_call.IMPL_COPY_WIDE,)
COPY_IMPLS = (copy_call.IMPL_COPY, copy_call.IMPL_COPY_WIDE)
# XLA flags that target small all-reduces in lax.psum; with --psum_flags each
# one is a baseline of its own.
PSUM_FLAGS = (
    "--xla_gpu_unsupported_use_all_reduce_one_shot_kernel=true",
    "--xla_gpu_experimental_use_collective_kernels=ALL_REDUCE",
    "--xla_gpu_experimental_enable_nccl_symmetric_buffers=true",
    "--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,COLLECTIVES",
)
DTYPES = {"f32": np.dtype(np.float32), "bf16": np.dtype(ml_dtypes.bfloat16),
          "f16": np.dtype(np.float16)}
DTYPES.update({"float32": DTYPES["f32"], "bfloat16": DTYPES["bf16"],
               "float16": DTYPES["f16"]})
DEFAULT_SIZES = (64, 256, 1024, 4096, 16384, 65536, 262144)

# Reference models (see `simulate`).
ROUNDED = "rounded"
EXCESS_F32 = "excess_f32"
LAX_PSUM = "lax.psum"
# The same two models with every step's sum JAX's own (a one-step lax.psum
# run in the same process: `psum_sums`): lax.psum's references.
PSUM_ROUNDED = "psum_rounded"
PSUM_EXCESS_F32 = "psum_excess_f32"
REFERENCES = (ROUNDED, EXCESS_F32, LAX_PSUM, PSUM_ROUNDED, PSUM_EXCESS_F32)
# The models whose sums are JAX's (they need a `psum_sums` function).
PSUM_MODELS = {PSUM_ROUNDED: ROUNDED, PSUM_EXCESS_F32: EXCESS_F32}
# The largest payload per rank a run may ask for, bytes; and the bounds of
# the chains' length, of the timed calls and of the timing rounds (a run
# beyond them is not a benchmark anyone waits for).
MAX_SIZE = 1 << 28
MAX_STEPS = 16384
MAX_CALLS = 1_000_000
MAX_ROUNDS = 1000

# A function from the ranks' values (one array per rank, one dtype and
# shape) to every rank's lax.psum of them, in rank order.
SumFn = Callable[[Sequence[np.ndarray]], Sequence[np.ndarray]]


@dataclasses.dataclass(frozen=True)
class Settings:
  """What one JAX-level run measures.

  Attributes:
    impls: impl names (`IMPLS`, `DIAG_IMPLS`).
    sizes: payload bytes per rank.
    dtypes: keys of `DTYPES`.
    k_short, k_long: the two chain lengths (steps).
    calls: timed calls per chain length and impl, spread over `rounds`.
    rounds: interleaved timing rounds.
    world: devices to use (0: all).
    seed: seed of the random inputs.
    timeline_max_bytes: read device periods from a profiler trace at sizes
      up to this (GPU only, not for lax.psum).
    anatomy_bytes: size per rank of the call anatomy (0: off; GPU only).
    psum_flags: XLA flags for the lax.psum baselines (empty: none).
    flag_timeout_s: seconds allowed per flag subprocess.
  """
  impls: tuple[str, ...] = IMPLS
  sizes: tuple[int, ...] = DEFAULT_SIZES
  dtypes: tuple[str, ...] = ("f32", "bf16")
  k_short: int = 32
  k_long: int = 512
  calls: int = 120
  rounds: int = 6
  world: int = 0
  seed: int = 0
  timeline_max_bytes: int = 4096
  anatomy_bytes: int = 0
  psum_flags: tuple[str, ...] = ()
  flag_timeout_s: int = 600


def settings_errors(sizes: Sequence[int], dtypes: Sequence[str], world: int,
                    devices: int) -> list[str]:
  """What is wrong with a run's sizes, dtypes and world on `devices`
  devices, one sentence each (empty when nothing is): sizes must be 1 to
  MAX_SIZE bytes per rank and a whole number of elements of every dtype
  (no size is rounded), dtypes keys of `DTYPES`, the world 0 (every
  device) or 2 up to the devices present."""
  errors = []
  if not sizes:
    errors.append("no sizes given")
  bad = [n for n in sizes if not 1 <= n <= MAX_SIZE]
  if bad:
    errors.append(f"sizes must be 1 to {MAX_SIZE} bytes per rank: {bad[0]}")
  unknown = [d for d in dtypes if d not in DTYPES]
  if not dtypes or unknown:
    errors.append(f"dtypes must be among {', '.join(DTYPES)}: {list(dtypes)}")
  for d in dtypes:
    if d in DTYPES:
      odd = [n for n in sizes if n % DTYPES[d].itemsize]
      if odd:
        errors.append(f"{odd[0]} bytes per rank is not a whole number of {DTYPES[d]} "
                      f"elements ({DTYPES[d].itemsize} bytes each)")
  if world == 1 or world < 0:
    errors.append(f"world {world}: an all-reduce needs 2 or more devices (0: all)")
  elif world > devices:
    errors.append(f"world {world}: only {devices} devices here")
  return errors


def flag_impl(flag: str) -> str:
  """Stable impl name of lax.psum under one XLA flag: ``lax.psum+<flag>``
  without the leading dashes."""
  return "lax.psum+" + flag.lstrip("-")


def op(impl: str) -> Callable[[jax.Array], jax.Array]:
  """The per-step operation of `impl` over mesh axis ``x``.

  Raises:
    ValueError: for an unknown impl name.
  """
  if impl == "lax.psum":
    return lambda x: lax.psum(x, "x")
  if impl == copy_call.IMPL_COPY:
    return copy_call.copy
  if impl == copy_call.IMPL_COPY_WIDE:
    return copy_call.copy_wide
  if impl.startswith("llar."):
    return lambda x: jax_llar.psum(x, "x")
  raise ValueError(f"unknown impl {impl!r}; known: {', '.join(IMPLS + DIAG_IMPLS)}")


def factors(world: int, dtype) -> np.ndarray:
  """The per-rank factors ``(r + 1) / (1 + ... + world)`` in `dtype`."""
  total = world * (world + 1) // 2
  return np.array([(r + 1) / total for r in range(world)]).astype(dtype)


def chain(impl: str, mesh: Mesh, k: int, dtype):
  """Jitted K-step chain of `impl` over mesh axis ``x``; input and output
  sharded over ``x`` (rank r's block is its vector)."""
  step = op(impl)
  table = jnp.asarray(factors(mesh.size, dtype))

  def body(x):
    f = table[lax.axis_index("x")]
    for _ in range(k):
      x = step(x) * f
    return x

  return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"),
                               out_specs=P("x"), check_vma=False))


def psum_sums(mesh: Mesh) -> SumFn:
  """JAX's own all-reduce on `mesh` (axis ``x``), one step at a time: a
  function from the ranks' values (rank r's array at position r) to each
  rank's ``lax.psum`` of them, computed by a separate jitted one-step
  shard_map program on the mesh's devices (compiled once per dtype and
  shape)."""
  world = mesh.size
  sharding = NamedSharding(mesh, P("x"))
  one_step = jax.jit(jax.shard_map(lambda v: lax.psum(v, "x"), mesh=mesh,
                                   in_specs=P("x"), out_specs=P("x"), check_vma=False))

  def sums(xs: Sequence[np.ndarray]) -> list[np.ndarray]:
    assert len(xs) == world, (len(xs), world)
    n = np.shape(xs[0])[0]
    out = np.asarray(one_step(jax.device_put(np.concatenate(xs), sharding)))
    return list(out.reshape(world, n))

  return sums


def simulate(impl: str, inputs: Sequence[np.ndarray], k: int, dtype,
             model: str = ROUNDED,
             sums: SumFn | None = None) -> list[np.ndarray] | None:
  """Host model of `chain`'s output per rank.

  Models:
    ``rounded``: every step's result is rounded to `dtype`, as it must be
      when each step is materialised in `dtype` (a custom call between
      steps): the all-reduce gives the float64 rank-order sum rounded once,
      the product the float64 product rounded once. Exact for jax_llar's
      fast path at any number of ranks, and for an all-reduce whose sum is
      the rank-order sum (two ranks).
    ``excess_f32``: XLA's excess precision for dtypes narrower than float32
      (``--xla_allow_excess_precision``, on by default): values between steps
      stay float32; the all-reduce adds the ranks' float32 values in rank
      order in float32 and rounds the sum to `dtype` (its result type); the
      multiply is done in float32 and its product is not rounded; only the
      chain's output is rounded to `dtype`. This is what XLA's CPU backend
      compiles a lax.psum chain of bfloat16 to (its optimised HLO: the
      all-reduce promoted to float32 with a convert of its result, the
      multiply's converts removed). None for float32 and wider, where it
      adds nothing to ``rounded``.
    ``psum_rounded``, ``psum_excess_f32``: the same two with every step's
      sum `sums` of that step's values (`psum_sums`: JAX's own lax.psum, in
      its own order and precision; in float32 for ``psum_excess_f32``, whose
      values between steps are float32). None without `sums`.

  Returns:
    one array per rank in `dtype`, or None when `model` does not apply.

  Raises:
    ValueError: for an unknown model.
  """
  dtype = np.dtype(dtype)
  f = factors(len(inputs), dtype)
  copy = impl in COPY_IMPLS
  base = PSUM_MODELS.get(model, model)
  if model in PSUM_MODELS and sums is None and not copy:
    return None
  if base == ROUNDED:
    xs = [np.asarray(x) for x in inputs]
    for _ in range(k):
      if copy:
        ys = xs
      elif model == PSUM_ROUNDED:
        ys = [np.asarray(y, dtype) for y in sums(xs)]
      else:
        ys = [testing.rank_order_sum(xs, dtype)] * len(xs)
      xs = [testing.round_from_f64(y.astype(np.float64) * np.float64(f[r]), dtype)
            for r, y in enumerate(ys)]
    return xs
  if base == EXCESS_F32:
    if dtype.itemsize >= 4:
      return None
    f32 = f.astype(np.float32)
    xs = [np.asarray(x).astype(np.float32) for x in inputs]
    with np.errstate(over="ignore", invalid="ignore"):
      for _ in range(k):
        if copy:
          ys = xs
        elif model == PSUM_EXCESS_F32:
          ys = [np.asarray(y, np.float32).astype(dtype).astype(np.float32)
                for y in sums(xs)]
        else:
          s = xs[0].copy()
          for x in xs[1:]:
            s = s + x
          ys = [s.astype(dtype).astype(np.float32)] * len(xs)
        xs = [y * f32[r] for r, y in enumerate(ys)]
      return [x.astype(dtype) for x in xs]
  raise ValueError(f"unknown reference model {model!r}")


def references_for(impl: str, platform: str, fast: bool | None) -> tuple[str, ...]:
  """The references a row of `impl` may match, in the order they are tried
  (each implementation's promise; see the module docstring).

  - jax_llar on its fast path: ``rounded`` only (the contract of the kernel:
    the rank order).
  - jax_llar that fell back: ``lax.psum``, bitwise the lax.psum chain's
    output on the same inputs (the contract of a fallback).
  - the copy calls: ``rounded`` on CUDA (a custom call between steps);
    elsewhere they are the identity and XLA may keep excess precision, so
    also ``excess_f32``.
  - lax.psum (any flags): ``psum_rounded`` or ``psum_excess_f32``, the sums
    JAX's own (no summation order is promised).
  """
  if impl.startswith("llar."):
    return (ROUNDED,) if fast else (LAX_PSUM,)
  if impl in COPY_IMPLS:
    return (ROUNDED,) if platform == "gpu" else (ROUNDED, EXCESS_F32)
  if impl == "lax.psum" or impl.startswith("lax.psum+"):
    return (PSUM_ROUNDED, PSUM_EXCESS_F32)
  return (ROUNDED, EXCESS_F32)


def check(impl: str, out: np.ndarray, inputs: Sequence[np.ndarray], k: int, dtype,
          references: Sequence[str],
          lax_psum_output: Callable[[], np.ndarray] | None = None,
          sums: SumFn | None = None) -> str | None:
  """The first of `references` that `out` (shape (ranks, n)) equals bitwise
  on every rank, or None. `lax_psum_output` computes the lax.psum chain's
  output on the same inputs (needed for the ``lax.psum`` reference); `sums`
  is JAX's one-step all-reduce (`psum_sums`, needed for the ``psum_*``
  references). A reference whose function is not given is not matched."""
  for ref in references:
    if ref == LAX_PSUM:
      if lax_psum_output is None:
        continue
      expect = list(np.asarray(lax_psum_output()))
    else:
      expect = simulate(impl, inputs, k, dtype, ref, sums)
      if expect is None:
        continue
    if all(testing.bitwise_equal(out[r], expect[r]) for r in range(len(inputs))):
      return ref
  return None


@contextlib.contextmanager
def forcing(algorithm: Algorithm) -> Iterator[None]:
  """Lowerings inside run `algorithm` wherever it serves
  (``settings.algorithm``), with the size cap at its largest
  (``settings.max_bytes``); both are restored on exit. A program compiled
  inside (``.lower(...).compile()``) keeps the forced algorithm; a jitted
  function called outside is lowered again with the settings then."""
  from jax_llar.config import MAX_BYTES_CAP, settings
  old = (settings.algorithm, settings.max_bytes)
  settings.algorithm, settings.max_bytes = algorithm.short_name, MAX_BYTES_CAP
  try:
    yield
  finally:
    settings.algorithm, settings.max_bytes = old


def _ran(k: int, nbytes: int, dtype) -> Algorithm | None:
  """The algorithm the last `k` recorded decisions ran, when all of them
  are for `nbytes` of `dtype` and ran the same one; else None (lax.psum)."""
  last = jax_llar.dispatch_log()[-k:]
  algs = {d.algorithm for d in last
          if d.bytes_per_rank == nbytes and d.dtype == str(np.dtype(dtype))}
  return algs.pop() if len(last) == k and len(algs) == 1 else None


def _time_once(fn, x) -> float:
  t0 = time.perf_counter()
  fn(x).block_until_ready()
  return time.perf_counter() - t0


def took_fast_path(nbytes: int, dtype) -> bool:
  """Whether the dispatch log holds a fast-path decision for a psum of
  `nbytes` per rank of `dtype`."""
  return any(d.fast and d.bytes_per_rank == nbytes and d.dtype == str(np.dtype(dtype))
             for d in jax_llar.dispatch_log())


def device_profile(fn, x, calls: int = 3) -> dict | None:
  """Cross-check from device timestamps: runs `fn` `calls` times under the
  JAX profiler and returns `traces.trace_stats` of the trace (per device the
  median and mean period between our kernels' starts, stalls, graph launch
  durations, start skew; microseconds; the profiler lengthens short
  kernels). On failure, ``{"error": ...}``: a cross-check never fails a
  run."""
  try:
    return traces.trace_stats(traces.profile(fn, x, calls=calls), calls)
  except Exception as e:  # noqa: BLE001 - a cross-check, never a reason to fail
    return {"error": f"{type(e).__name__}: {e}"}


def _mean_of(profile: dict | None, key: str) -> float | None:
  vals = [v[key] for v in (profile or {}).get("devices", {}).values()
          if v.get(key) is not None]
  return float(np.mean(vals)) if vals else None


def measure(impls: Sequence[str], mesh: Mesh, dtype, nbytes: int, k_short: int,
            k_long: int, calls: int, rounds: int, rng: np.random.Generator,
            timeline: bool = False,
            forced: Mapping[str, Algorithm] | None = None) -> list[dict]:
  """Per-step time of each impl's chain at one size (one row per impl).

  Each impl gets its own random inputs and is checked first (see the module
  docstring). Then `rounds` rounds; in each, every impl times
  ``calls // rounds`` calls of the short chain and as many of the long one,
  impls in an order that rotates from round to round, so that a slow drift
  of the machine affects all impls alike. Per-step time = (median of all
  long calls - median of all short calls) / (k_long - k_short).

  `forced` maps jax_llar impls (``llar.<name>``) to the algorithm each must
  run: its chains are compiled ahead of time under `forcing`, and its row's
  ``fast_path`` is True only when every psum of the short chain ran that
  algorithm (the dispatch log says which ran).

  Row keys: impl, world_size, dtype, bytes_per_rank, us_per_call (the
  slope, microseconds per step), us_round_min / us_round_max /
  us_round_median, k_short, k_long, calls_each, t_short_ms, t_long_ms,
  correct, reference, references_tried, fast_path (jax_llar rows; else None),
  algorithm (the algorithm a jax_llar impl ran on the short chain; None for
  a fallback and for the other impls),
  device_period_us, device_mean_period_us, device_profile.
  """
  impls = list(impls)
  world = mesh.size
  n = max(1, nbytes // dtype.itemsize)
  sharding = NamedSharding(mesh, P("x"))
  platform = mesh.devices.flat[0].platform
  sums = psum_sums(mesh)
  state = {}
  for impl in impls:
    inputs = [testing.random_array(rng, (n,), dtype) for _ in range(world)]
    x = jax.device_put(np.concatenate(inputs), sharding)
    algorithm = (forced or {}).get(impl)
    ran = None
    if algorithm is None:
      f_short = chain(impl, mesh, k_short, dtype)
      f_long = chain(impl, mesh, k_long, dtype)
    else:
      with forcing(algorithm):
        f_short = chain(impl, mesh, k_short, dtype).lower(x).compile()
        ran = _ran(k_short, n * dtype.itemsize, dtype)
        f_long = chain(impl, mesh, k_long, dtype).lower(x).compile()
    out = np.asarray(f_short(x)).reshape(world, n)
    if algorithm is not None:
      fast = ran is algorithm
    elif impl.startswith("llar."):
      fast = took_fast_path(n * dtype.itemsize, dtype)
      ran = _ran(k_short, n * dtype.itemsize, dtype)
    else:
      fast = None
    refs = references_for(impl, platform, fast)

    def lax_psum_output(x=x):  # compiled only when a fallback is checked
      return np.asarray(chain("lax.psum", mesh, k_short, dtype)(x)).reshape(world, n)

    ref = check(impl, out, inputs, k_short, dtype, refs, lax_psum_output, sums)
    f_long(x).block_until_ready()
    state[impl] = dict(x=x, f_short=f_short, f_long=f_long, reference=ref, refs=refs,
                       fast=fast, ran=ran, slopes=[], ts=[], tl=[])
  per_round = max(1, calls // rounds)
  for r in range(rounds):
    order = impls[r % len(impls):] + impls[: r % len(impls)]
    for impl in order:
      st = state[impl]
      ts = [_time_once(st["f_short"], st["x"]) for _ in range(per_round)]
      tl = [_time_once(st["f_long"], st["x"]) for _ in range(per_round)]
      st["ts"] += ts
      st["tl"] += tl
      st["slopes"].append((statistics.median(tl) - statistics.median(ts)) /
                          (k_long - k_short))
  rows = []
  for impl in impls:
    st = state[impl]
    slope_all = (statistics.median(st["tl"]) - statistics.median(st["ts"])) / (
        k_long - k_short)
    profile = (device_profile(st["f_long"], st["x"])
               if timeline and platform == "gpu" and impl != "lax.psum" else None)
    rows.append({
        "impl": impl, "world_size": world, "dtype": str(dtype),
        "bytes_per_rank": n * dtype.itemsize, "us_per_call": slope_all * 1e6,
        "us_round_min": min(st["slopes"]) * 1e6, "us_round_max": max(st["slopes"]) * 1e6,
        "us_round_median": statistics.median(st["slopes"]) * 1e6,
        "k_short": k_short, "k_long": k_long, "calls_each": per_round * rounds,
        "t_short_ms": statistics.median(st["ts"]) * 1e3,
        "t_long_ms": statistics.median(st["tl"]) * 1e3,
        "correct": st["reference"] is not None,
        "reference": st["reference"],
        "references_tried": list(st["refs"]),
        "fast_path": st["fast"],
        # What ran: the impl itself, or lax.psum where jax_llar fell back.
        "ran": "lax.psum" if st["fast"] is False else impl,
        "algorithm": st["ran"].short_name if st["ran"] is not None else None,
        "device_period_us": _mean_of(profile, "period_us_median"),
        "device_mean_period_us": _mean_of(profile, "period_us_mean"),
        "device_profile": profile,
    })
  return rows


def _bracketed_copy_chain(mesh: Mesh, k: int, dtype):
  """psum, then K steps of copy-then-multiply, then psum: the two
  all-reduces' call-trace timestamps bracket a chain of copy calls."""
  table = jnp.asarray(factors(mesh.size, dtype))

  def body(x):
    f = table[lax.axis_index("x")]
    x = jax_llar.psum(x, "x")
    for _ in range(k):
      x = copy_call.copy(x) * f
    return jax_llar.psum(x, "x")

  return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"),
                               out_specs=P("x"), check_vma=False))


def call_anatomy(mesh: Mesh, dtype, nbytes: int, k_short: int, k_long: int,
                 rng: np.random.Generator, reps: int = 7) -> dict:
  """Per step of a chain, how much of a jitted call's growth with K is host
  time before the first all-reduce kernel, device time, and host time after.

  Per GPU and call: ``pre`` = the first all-reduce kernel's send time minus
  the host's call time, ``span`` = the last all-reduce kernel's end minus
  that send, ``post`` = the host's return time minus that end; host times
  from ``time.time_ns()``, device times from the kernels' call trace (the
  GPU's global timer). A GPU's timer and the host clock differ by an unknown
  offset, so only differences between the two chain lengths are reported,
  per GPU: (median at k_long - median at k_short) / (k_long - k_short), in
  microseconds per step. Done for the all-reduce chain and for a chain of
  copy calls bracketed by one all-reduce at each end; outputs are checked
  against the ``rounded`` model.

  Programs compiled after this call launch the call-trace variant of the
  kernel (the trace stays enabled).

  Raises:
    RuntimeError: when the native tools module is unavailable, the
      all-reduce did not take the fast path at this size, or k_long exceeds
      the trace's TRACE_SLOTS.
  """
  from jax_llar import comm
  mod = _native.require("the call anatomy")
  if k_long > mod.TRACE_SLOTS:
    raise RuntimeError(f"call anatomy needs k_long <= {mod.TRACE_SLOTS}")
  world = mesh.size
  n = max(1, nbytes // dtype.itemsize)
  inputs = [testing.random_array(rng, (n,), dtype) for _ in range(world)]
  x = jax.device_put(np.concatenate(inputs), NamedSharding(mesh, P("x")))
  cs = comm.get_or_create([[d.local_hardware_id for d in mesh.devices.flat]])
  # Programs recorded from here on launch the call-trace variant of the
  # kernel (the rows timed before keep the plain one).
  mod.enable_call_trace(cs.comm_id)
  devs = list(cs.groups[0])
  out = {}
  for name, build, traced_calls in (
      ("llar_chain", lambda k: chain(LLAR, mesh, k, dtype), lambda k: k),
      ("bracketed_copy_chain", lambda k: _bracketed_copy_chain(mesh, k, dtype),
       lambda k: 2)):
    per_k = {}
    for k in (k_short, k_long):
      fn = build(k)
      got = np.asarray(fn(x)).reshape(world, n)
      if not took_fast_path(n * dtype.itemsize, dtype):
        raise RuntimeError("call anatomy: the all-reduce fell back to lax.psum at "
                           f"{n * dtype.itemsize} bytes; no call trace to read")
      if name == "llar_chain":
        expect = simulate(LLAR, inputs, k, dtype)
      else:  # psum, then the copy chain's K steps, then psum
        xs = simulate(copy_call.IMPL_COPY,
                      [testing.rank_order_sum(inputs, dtype)] * world, k, dtype)
        expect = [testing.rank_order_sum(xs, dtype)] * world
      correct = all(testing.bitwise_equal(got[r], expect[r]) for r in range(world))
      samples = {dev: [] for dev in devs}
      for _ in range(reps):
        t0 = time.time_ns()
        fn(x).block_until_ready()
        t1 = time.time_ns()
        for dev in devs:
          calls, words = mod.read_call_trace(cs.comm_id, dev)
          m = traced_calls(k)
          first = words[2 * ((calls - m) % mod.TRACE_SLOTS)]
          last = words[2 * ((calls - 1) % mod.TRACE_SLOTS) + 1]
          samples[dev].append(((first - t0) / 1e3, (last - first) / 1e3, (t1 - last) / 1e3))
      per_k[k] = ({dev: np.median(np.array(v), axis=0) for dev, v in samples.items()},
                  correct)
    steps = k_long - k_short
    out[name] = {
        "correct": bool(per_k[k_short][1] and per_k[k_long][1]),
        "per_gpu": {
            f"cuda:{dev}": {
                key: float((per_k[k_long][0][dev][i] - per_k[k_short][0][dev][i]) / steps)
                for i, key in enumerate(("pre_us_per_step", "span_us_per_step",
                                         "post_us_per_step"))}
            for dev in devs},
    }
  return out


def child_command(s: Settings, out_dir: str) -> list[str]:
  """The command line of one flag baseline: this level's bench with lax.psum
  only, the same sizes, dtypes, chain lengths, calls, rounds, world and
  seed, writing to `out_dir`."""
  return [sys.executable, "-m", "jax_llar.tools.bench", "--level=jax",
          "--impls=lax.psum", "--sizes=" + ",".join(map(str, s.sizes)),
          "--dtypes=" + ",".join(s.dtypes), f"--k_short={s.k_short}",
          f"--k_long={s.k_long}", f"--calls={s.calls}", f"--rounds={s.rounds}",
          f"--world={s.world}", f"--seed={s.seed}", "--timeline_max_bytes=0",
          f"--out={out_dir}", "--tag=-flag"]


def run_flag_child(command, flags: str, timeout_s: float):
  """Runs ``command(out_dir)`` (an argv list) in a child process with `flags`
  appended to ``XLA_FLAGS`` (XLA reads its flags once, at backend start).

  Returns:
    (rc, output_tail, result, xla_flags): the exit status (or "timeout"),
    the last 3000 characters of its output, the result file it wrote to
    out_dir (a dict) or None, and the child's ``XLA_FLAGS``.
  """
  env = dict(os.environ)
  env["XLA_FLAGS"] = " ".join(f for f in (env.get("XLA_FLAGS", ""), flags) if f)
  # The parent still holds its own (preallocated) device memory: the child
  # allocates on demand, or it runs out of memory at start.
  env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  with tempfile.TemporaryDirectory(prefix="llar_flag_") as out:
    try:
      proc = subprocess.run(command(out), env=env, capture_output=True, text=True,
                            timeout=timeout_s)
      rc, tail = proc.returncode, (proc.stdout + proc.stderr)[-3000:]
    except subprocess.TimeoutExpired as e:
      rc, tail = "timeout", str(e)[-500:]
    files = glob.glob(os.path.join(out, "*.json"))
    result = None
    if files:
      with open(files[0]) as f:
        result = json.load(f)
  return rc, tail, result, env["XLA_FLAGS"]


def run_psum_flag_baselines(s: Settings) -> tuple[list[dict], list[dict]]:
  """lax.psum with each of ``s.psum_flags`` appended to ``XLA_FLAGS``, each in
  a child process (`child_command`). Returns the rows (impl renamed to
  ``lax.psum+<flag>``, ``xla_flags`` added) and one record per failed child
  (flag, rc, output tail)."""
  rows, failures = [], []
  for flag in s.psum_flags:
    rc, tail, child, xla_flags = run_flag_child(lambda out: child_command(s, out), flag,
                                                s.flag_timeout_s)
    if rc != 0 or child is None:
      failures.append({"flag": flag, "rc": rc, "output_tail": tail[-1500:]})
      print(f"lax.psum with {flag}: child failed (rc={rc})", flush=True)
      continue
    for r in child["rows"]:
      r["impl"] = flag_impl(flag)
      r["xla_flags"] = xla_flags
      rows.append(r)
      print(f"{r['impl']} {r['dtype']} {r['bytes_per_rank']} B "
            f"{r['us_per_call']:8.2f} us/step correct={r['correct']}", flush=True)
  return rows, failures


def run(s: Settings) -> dict:
  """Runs the JAX level; prints one line per row as it goes.

  Returns:
    the result: ``{"env", "level": "jax", "rows", "psum_flag_failures",
    "call_anatomy", "dispatch"}`` (dispatch: the last 50 lowering decisions,
    as dicts).

  Raises:
    RuntimeError: with fewer than two devices.
    ValueError: for settings `settings_errors` refuses.
  """
  devices = jax.devices()
  if len(devices) < 2:
    raise RuntimeError("the JAX level needs at least 2 devices")
  errors = settings_errors(s.sizes, s.dtypes, s.world, len(devices))
  if errors:
    raise ValueError("; ".join(errors))
  mesh = Mesh(np.array(devices[: s.world or len(devices)]), ("x",))
  rng = np.random.default_rng(s.seed)
  rows = []
  progress = Progress(len(s.dtypes) * len(s.sizes), "jax level")
  for dt_name in s.dtypes:
    dtype = DTYPES[dt_name]
    for nbytes in s.sizes:
      for row in measure(s.impls, mesh, dtype, nbytes, s.k_short, s.k_long, s.calls,
                         s.rounds, rng, timeline=nbytes <= s.timeline_max_bytes):
        rows.append(row)
        note = ("  (negative slope: timing noise around a cost near zero; longer "
                "chains or more calls narrow it)" if row["us_per_call"] < 0 else "")
        print(f"{row['impl']:22s} {dt_name:5s} {row['bytes_per_rank']:8d} B "
              f"{row['us_per_call']:8.2f} us/step [{row['us_round_min']:.2f}, "
              f"{row['us_round_max']:.2f}] correct={row['correct']} "
              f"reference={row['reference']} fast_path={row['fast_path']}{note}",
              flush=True)
      progress.step(f"{dt_name} {nbytes} B")
  anatomy = None  # last: it turns the call trace on for later programs
  if s.anatomy_bytes and devices[0].platform == "gpu" and _native.load() is not None:
    try:
      anatomy = call_anatomy(mesh, DTYPES[s.dtypes[0]], s.anatomy_bytes,
                             s.k_short, s.k_long, rng)
    except RuntimeError as e:  # an addition to the rows, never a reason to lose them
      anatomy = {"error": str(e)}
      print(f"--anatomy_bytes: no call anatomy: {e}", flush=True)
    for key, v in anatomy.items():
      if key == "error":
        continue
      for dev, g in v["per_gpu"].items():
        print(f"anatomy {key:22s} {dev}: per step, host before "
              f"{g['pre_us_per_step']:6.2f} us, device {g['span_us_per_step']:6.2f} us, "
              f"host after {g['post_us_per_step']:6.2f} us  correct={v['correct']}",
              flush=True)
  elif s.anatomy_bytes:
    print("--anatomy_bytes: skipped (needs CUDA GPUs and the native tools module"
          f"{': ' + _native.reason() if _native.reason() else ''})", flush=True)
  failures = []
  if s.psum_flags:
    flag_rows, failures = run_psum_flag_baselines(s)
    rows += flag_rows
  return {"env": report.environment(), "level": "jax", "rows": rows,
          "psum_flag_failures": failures, "call_anatomy": anatomy,
          "dispatch": [d.to_dict() for d in jax_llar.dispatch_log()][-50:]}
