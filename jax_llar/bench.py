"""Benchmarks: ``python -m jax_llar.bench --level jax`` (BENCHMARK.md).

JAX level: ``jax.jit`` of a ``shard_map`` with K dependent steps
``x = op(x) * f[axis_index]`` where ``op`` is the implementation under test and
``f[r] = (r + 1) / (1 + 2 + ... + W)`` (BENCHMARK.md multiplies by
``axis_index + 1``; dividing by the sum keeps 512 steps finite and non-zero).
Per-step time is the slope ``(T(K_long) - T(K_short)) / (K_long - K_short)``
of median wall times of whole jitted calls, which removes the fixed cost of a
jitted call. The two chain lengths are timed in interleaved rounds; the
reported figure is the slope between the medians over all rounds, with the
min and max of the per-round slopes.

Implementations (impl names are stable, BENCHMARK.md):
  lax.psum              XLA's all-reduce (NCCL), default flags
  xla.custom_call_copy  a copy kernel behind the same FFI path as jax_llar:
                        XLA's own cost per custom call step
  llar.one_shot_ll      jax_llar.psum on the one-shot LL kernel
  diag.custom_call_copy_wide  (diagnostic, only when asked for with --impls)
                        the copy kernel with a 208-byte parameter block
  lax.psum+<flag>       with --psum-flags: lax.psum with one XLA flag from
                        MEASURED.md set, each in its own subprocess (XLA
                        flags are fixed when the backend starts)

Before timing, every configuration runs its short chain once on random data
and the result is compared bitwise with a host simulation of the chain
(float64 rank-order sums rounded once, products rounded once); the row
records ``"correct": true/false``.

Results: ``<out>/<machine>-<yyyymmdd>-jax.json`` (shape from BENCHMARK.md)
plus a PNG plot, and a table on stdout.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_llar
from jax_llar import _copy, _ext, _host, graphcheck, testing

IMPLS = ("lax.psum", "xla.custom_call_copy", "llar.one_shot_ll")
# XLA flags that MEASURED.md tried on lax.psum; each is a baseline of its own.
PSUM_FLAGS = (
    "--xla_gpu_unsupported_use_all_reduce_one_shot_kernel=true",
    "--xla_gpu_experimental_use_collective_kernels=ALL_REDUCE",
    "--xla_gpu_experimental_enable_nccl_symmetric_buffers=true",
    "--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,COLLECTIVES",
)


def flag_impl(flag: str) -> str:
  """Stable impl name of lax.psum under one XLA flag (BENCHMARK.md)."""
  return "lax.psum+" + flag.lstrip("-")


def run_psum_flag_baselines(args) -> tuple[list[dict], list[dict]]:
  """lax.psum with each of PSUM_FLAGS, each in a child process of this
  module (same sizes, dtypes, chain lengths, calls and seed). Returns the
  rows (impl renamed to lax.psum+<flag>) and one record per failed child."""
  import tempfile
  rows, failures = [], []
  for flag in PSUM_FLAGS:
    with tempfile.TemporaryDirectory(prefix="llar_flag_") as out:
      _run_flag_child(args, flag, out, rows, failures)
  return rows, failures


def _run_flag_child(args, flag: str, out: str, rows: list, failures: list) -> None:
  import glob
  env = dict(os.environ)
  env["XLA_FLAGS"] = " ".join(f for f in (env.get("XLA_FLAGS", ""), flag) if f)
  cmd = [sys.executable, "-m", "jax_llar.bench", "--level", "jax",
         "--impls", "lax.psum", "--sizes", ",".join(map(str, args.sizes)),
         "--dtypes", ",".join(args.dtypes), "--k-short", str(args.k_short),
         "--k-long", str(args.k_long), "--calls", str(args.calls),
         "--rounds", str(args.rounds), "--world", str(args.world),
         "--seed", str(args.seed), "--out", out, "--tag=-flag"]
  try:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                          timeout=args.flag_timeout)
    rc, tail = proc.returncode, (proc.stdout + proc.stderr)[-1500:]
  except subprocess.TimeoutExpired as e:
    rc, tail = "timeout", str(e)[-500:]
  files = glob.glob(os.path.join(out, "*.json"))
  if rc != 0 or not files:
    failures.append({"flag": flag, "rc": rc, "output_tail": tail})
    print(f"lax.psum with {flag}: child failed (rc={rc})", flush=True)
    return
  with open(files[0]) as f:
    child = json.load(f)
  for r in child["rows"]:
    r["impl"] = flag_impl(flag)
    r["xla_flags"] = env["XLA_FLAGS"]
    rows.append(r)
    print(f"{r['impl']} {r['dtype']} {r['bytes_per_rank']} B "
          f"{r['us_per_call']:8.2f} us/step correct={r['correct']}", flush=True)


DTYPES = {"f32": np.dtype(np.float32), "bf16": np.dtype(ml_dtypes.bfloat16),
          "f16": np.dtype(np.float16)}
DTYPES.update({"float32": DTYPES["f32"], "bfloat16": DTYPES["bf16"],
               "float16": DTYPES["f16"]})


def _dtypes_arg(text: str) -> list[str]:
  names = [t.strip() for t in text.split(",") if t.strip()]
  bad = [n for n in names if n not in DTYPES]
  if bad:
    raise argparse.ArgumentTypeError(
        f"unknown dtype(s) {bad}; use f32, bf16, f16 (or float32, bfloat16, float16)")
  return names
DEFAULT_SIZES = (64, 256, 1024, 4096, 16384, 65536, 262144)


def _op(impl: str):
  if impl == "lax.psum":
    return lambda x: lax.psum(x, "x")
  if impl == "xla.custom_call_copy":
    return _copy.copy
  if impl == "diag.custom_call_copy_wide":
    return _copy.copy_wide
  if impl.startswith("llar."):
    return lambda x: jax_llar.psum(x, "x")
  raise ValueError(f"unknown impl {impl}")


def factors(world: int, dtype) -> np.ndarray:
  total = world * (world + 1) // 2
  return np.array([(r + 1) / total for r in range(world)]).astype(dtype)


def chain(impl: str, mesh: Mesh, k: int, dtype):
  """Jitted K-step chain over mesh axis 'x'; input/output sharded over 'x'."""
  op = _op(impl)
  table = jnp.asarray(factors(mesh.size, dtype))

  def body(x):
    f = table[lax.axis_index("x")]
    for _ in range(k):
      x = op(x) * f
    return x

  return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"),
                               out_specs=P("x"), check_vma=False))


def simulate(impl: str, inputs: list[np.ndarray], k: int, dtype) -> list[np.ndarray]:
  """Host model of `chain`: exact for W = 2 (and for jax_llar at any W)."""
  f = factors(len(inputs), dtype)
  xs = [np.asarray(x) for x in inputs]
  for _ in range(k):
    if impl in ("xla.custom_call_copy", "diag.custom_call_copy_wide"):
      ys = xs
    else:
      s = testing.rank_order_sum(xs, dtype)
      ys = [s] * len(xs)
    xs = [testing.round_from_f64(y.astype(np.float64) * np.float64(f[r]), dtype)
          for r, y in enumerate(ys)]
  return xs


def _time_once(fn, x) -> float:
  t0 = time.perf_counter()
  fn(x).block_until_ready()
  return time.perf_counter() - t0


def device_profile(fn, x, calls: int = 3) -> dict | None:
  """Cross-check from device timestamps (BENCHMARK.md): runs `fn` `calls`
  times under the JAX profiler and returns graphcheck.trace_stats of the
  trace (per-GPU median and mean period between our kernels' starts, stalls,
  graph launch durations, start skew between GPUs; microseconds; the
  profiler adds a little to short kernels). None when no trace could be read.
  """
  import glob
  import gzip
  import shutil
  import tempfile
  d = tempfile.mkdtemp(prefix="llar_tl_")
  try:
    with jax.profiler.trace(d, create_perfetto_trace=True):
      for _ in range(calls):
        fn(x).block_until_ready()
    paths = glob.glob(os.path.join(d, "**", "*perfetto_trace.json.gz"), recursive=True)
    if not paths:
      return None
    with gzip.open(paths[0], "rt") as f:
      events = json.load(f).get("traceEvents", [])
    return graphcheck.trace_stats(events, calls)
  except Exception as e:  # noqa: BLE001 - a cross-check, never a reason to fail
    return {"error": f"{type(e).__name__}: {e}"}
  finally:
    shutil.rmtree(d, ignore_errors=True)


def _bracketed_copy_chain(mesh: Mesh, k: int, dtype):
  """psum, then K steps of copy-then-multiply, then psum: the two all-reduces'
  call-trace timestamps bracket a chain of copy custom calls."""
  table = jnp.asarray(factors(mesh.size, dtype))

  def body(x):
    f = table[lax.axis_index("x")]
    x = jax_llar.psum(x, "x")
    for _ in range(k):
      x = _copy.copy(x) * f
    return jax_llar.psum(x, "x")

  return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"),
                               out_specs=P("x"), check_vma=False))


def call_anatomy(mesh, dtype, nbytes, k_short, k_long, rng, reps: int = 7) -> dict:
  """Per step of a chain, how much of a jitted call's growth with K is host
  time before the first all-reduce kernel, device time, and host time after.

  Per GPU and call: `pre` = first all-reduce kernel's send time minus the
  host's call time, `span` = last all-reduce kernel's end minus that send,
  `post` = host's return time minus that end; host times from
  time.time_ns(), device times from the kernels' call trace (%globaltimer).
  A GPU's timer and the host clock differ by an unknown offset (up to about
  1 ms here), so only differences between the two chain lengths are
  reported, per GPU: (median at K_long - median at K_short) / (K_long -
  K_short), in microseconds per step. Done for the all-reduce chain and for
  a chain of copy calls bracketed by one all-reduce at each end. Results are
  checked against the host simulation.

  Raises:
    RuntimeError: when the all-reduce did not take the fast path at this
      size, or K_long exceeds the trace's TRACE_SLOTS.
  """
  from jax_llar import comm
  mod = _ext.load()
  if k_long > mod.TRACE_SLOTS:
    raise RuntimeError(f"call anatomy needs K_long <= {mod.TRACE_SLOTS}")
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
      ("llar_chain", lambda k: chain("llar.one_shot_ll", mesh, k, dtype), lambda k: k),
      ("bracketed_copy_chain", lambda k: _bracketed_copy_chain(mesh, k, dtype), lambda k: 2)):
    per_k = {}
    for k in (k_short, k_long):
      fn = build(k)
      got = np.asarray(fn(x)).reshape(world, n)
      if not any(d.fast and d.bytes_per_rank == n * dtype.itemsize and
                 d.dtype == str(dtype) for d in jax_llar.dispatch_log()):
        raise RuntimeError("call anatomy: the all-reduce fell back to lax.psum at "
                           f"{n * dtype.itemsize} bytes; no call trace to read")
      if name == "llar_chain":
        expect = simulate("llar.one_shot_ll", inputs, k, dtype)
      else:  # psum, then the copy chain's K steps, then psum
        xs = simulate("xla.custom_call_copy",
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


def _mean_of(profile, key):
  vals = [v[key] for v in (profile or {}).get("devices", {}).values()
          if v.get(key) is not None]
  return float(np.mean(vals)) if vals else None


def measure(impls, mesh, dtype, nbytes, k_short, k_long, calls, rounds, rng,
            timeline=False) -> list[dict]:
  """Per-step time of each impl's chain at one size (BENCHMARK.md, JAX level).

  Each impl gets its own random inputs, checked against the host simulation
  first. Then `rounds` rounds; in each, every impl times calls // rounds calls
  of the short chain and as many of the long one, impls in an order that
  rotates from round to round, so that a slow drift of the machine (clocks,
  other load) affects all impls alike. Per-step time = (median of all long
  calls - median of all short calls) / (k_long - k_short), in seconds.
  """
  world = mesh.size
  n = max(1, nbytes // dtype.itemsize)
  sharding = NamedSharding(mesh, P("x"))
  state = {}
  for impl in impls:
    inputs = [testing.random_array(rng, (n,), dtype) for _ in range(world)]
    x = jax.device_put(np.concatenate(inputs), sharding)
    f_short = chain(impl, mesh, k_short, dtype)
    f_long = chain(impl, mesh, k_long, dtype)
    out = np.asarray(f_short(x)).reshape(world, n)
    expect = simulate(impl, inputs, k_short, dtype)
    correct = all(testing.bitwise_equal(out[r], expect[r]) for r in range(world))
    fast = any(d.fast and d.bytes_per_rank == n * dtype.itemsize and
               d.dtype == str(dtype) for d in jax_llar.dispatch_log())
    f_long(x).block_until_ready()
    state[impl] = dict(x=x, f_short=f_short, f_long=f_long, correct=correct,
                       fast=fast, slopes=[], ts=[], tl=[])
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
               if timeline and impl != "lax.psum" else None)
    rows.append({
        "impl": impl, "world_size": world, "dtype": str(dtype),
        "bytes_per_rank": n * dtype.itemsize, "us_per_call": slope_all * 1e6,
        "us_round_min": min(st["slopes"]) * 1e6, "us_round_max": max(st["slopes"]) * 1e6,
        "us_round_median": statistics.median(st["slopes"]) * 1e6,
        "k_short": k_short, "k_long": k_long, "calls_each": per_round * rounds,
        "t_short_ms": statistics.median(st["ts"]) * 1e3,
        "t_long_ms": statistics.median(st["tl"]) * 1e3,
        "correct": bool(st["correct"]),
        "fast_path": bool(st["fast"]) if impl.startswith("llar.") else None,
        "device_period_us": _mean_of(profile, "period_us_median"),
        "device_mean_period_us": _mean_of(profile, "period_us_mean"),
        "device_profile": profile,
    })
  return rows


def environment() -> dict:
  env = {
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
      "jax": jax.__version__, "jaxlib": jax.lib.__version__ if hasattr(jax.lib, "__version__") else None,
      "python": platform.python_version(),
      "devices": [d.device_kind for d in jax.devices()],
      "device_count": jax.device_count(),
      "xla_flags": os.environ.get("XLA_FLAGS", ""),
      "git_commit": os.environ.get("LLAR_GIT_COMMIT") or graphcheck.git_commit(),
  }
  try:
    import jaxlib
    env["jaxlib"] = jaxlib.__version__
  except Exception:  # noqa: BLE001 - informational only
    pass
  try:
    q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                        "--format=csv,noheader"], capture_output=True, text=True,
                       timeout=30)
    env["nvidia_smi"] = q.stdout.strip().splitlines()
  except (OSError, subprocess.SubprocessError):
    env["nvidia_smi"] = None
  try:
    env["cuda_runtime_platform"] = jax.devices()[0].client.platform_version
  except Exception:  # noqa: BLE001
    pass
  st = jax_llar.status()
  env["nccl_runtime"] = st["nccl_runtime"]
  env["nccl_compiled"] = st["nccl_compiled"]
  env["nccl_library"] = st["nccl_library"]
  return env


def machine_name() -> str:
  kind = jax.devices()[0].device_kind.lower().replace("nvidia ", "").replace(" ", "")
  return f"{kind}x{jax.device_count()}"


def plot(rows, path, title):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  dtypes = sorted({r["dtype"] for r in rows})
  fig, axes = plt.subplots(1, len(dtypes), figsize=(6 * len(dtypes), 4.5), squeeze=False)
  for ax, dt in zip(axes[0], dtypes):
    for impl in sorted({r["impl"] for r in rows}):
      pts = sorted((r["bytes_per_rank"], r["us_per_call"]) for r in rows
                   if r["impl"] == impl and r["dtype"] == dt)
      if pts:
        ax.plot([p[0] for p in pts], [max(p[1], 1e-2) for p in pts], "o-", label=impl)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("bytes per rank")
    ax.set_ylabel("us per step (slope)")
    ax.set_title(f"{title} {dt}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6)
  fig.tight_layout()
  fig.savefig(path, dpi=110)


def print_table(rows):
  by = {}
  for r in rows:
    by.setdefault((r["dtype"], r["bytes_per_rank"]), {})[r["impl"]] = r
  flags = sorted({r["impl"] for r in rows if r["impl"].startswith("lax.psum+")})
  impls = [i for i in IMPLS if any(i in v for v in by.values())]
  impls += sorted({r["impl"] for r in rows} - set(impls) - set(flags) - set(IMPLS))
  head = f"{'dtype':9s} {'bytes':>8s} " + " ".join(f"{i:>22s}" for i in impls)
  if {"llar.one_shot_ll", "xla.custom_call_copy", "lax.psum"} <= set(impls):
    head += (f" {'llar-copy':>10s} {'psum/llar':>10s} {'dev llar-copy':>14s}"
             f" {'mean llar-copy':>15s}")
  print(head)
  for (dt, b), v in sorted(by.items()):
    cells = []
    for i in impls:
      r = v.get(i)
      mark = ("" if r is None or r["correct"] else "!") + (
          "*" if r is not None and r.get("fast_path") is False else "")
      cells.append(f"{r['us_per_call']:8.2f} [{r['us_round_min']:5.1f},{r['us_round_max']:5.1f}]"
                   f"{mark}" if r else f"{'-':>22s}")
    line = f"{dt:9s} {b:8d} " + " ".join(f"{c:>22s}" for c in cells)
    if (all(i in v for i in ("llar.one_shot_ll", "xla.custom_call_copy", "lax.psum"))
        and v["llar.one_shot_ll"].get("fast_path")):
      ll, cp, ps = (v[i]["us_per_call"] for i in ("llar.one_shot_ll", "xla.custom_call_copy", "lax.psum"))
      line += f" {ll - cp:10.2f} {ps / ll if ll > 0 else float('nan'):10.1f}"
      dl, dc = v["llar.one_shot_ll"].get("device_period_us"), v["xla.custom_call_copy"].get("device_period_us")
      line += f" {dl - dc:14.2f}" if dl and dc else f" {'-':>14s}"
      ml = v["llar.one_shot_ll"].get("device_mean_period_us")
      mc = v["xla.custom_call_copy"].get("device_mean_period_us")
      line += f" {ml - mc:15.2f}" if ml and mc else f" {'-':>15s}"
    print(line)
  print("(us per step: median-of-all slope [min, max over rounds]; '!' = result "
        "did not match the host simulation; '*' = jax_llar fell back to lax.psum, "
        "so no ratio is printed; 'dev llar-copy': difference of the median "
        "per-step device periods read from a profiler trace; 'mean llar-copy': "
        "the same with mean periods, which include the GPUs' stalls)")
  if not flags:
    return
  print("lax.psum under XLA flags (us per step; 'best psum/llar' takes the "
        "fastest lax.psum variant of the row, default flags included):")
  for i, f in enumerate(flags):
    print(f"  [{i}] {f}")
  print(f"{'dtype':9s} {'bytes':>8s} " + " ".join(f"{'[' + str(i) + ']':>8s}" for i in range(len(flags)))
        + f" {'best psum/llar':>15s}")
  for (dt, b), v in sorted(by.items()):
    cells = [f"{v[f]['us_per_call']:8.2f}" if f in v else f"{'-':>8s}" for f in flags]
    psums = [v[f]["us_per_call"] for f in ["lax.psum"] + flags
             if f in v and v[f]["correct"]]
    ll = v.get("llar.one_shot_ll")
    ratio = (f"{min(psums) / ll['us_per_call']:15.1f}"
             if psums and ll and ll.get("fast_path") and ll["us_per_call"] > 0
             else f"{'-':>15s}")
    print(f"{dt:9s} {b:8d} " + " ".join(cells) + " " + ratio)


KERNEL_IMPLS = {"llar.one_shot_ll": "one_shot_ll", "kernel.copy": "copy",
                "nccl.allreduce": "nccl",
                # Diagnostic, not an all-reduce: one_shot_ll with every peer
                # store looped back into the rank's own scratch (no network);
                # each rank's output is its input summed world-size times.
                "diag.one_shot_ll_loopback": "one_shot_ll_loopback",
                # Diagnostic: the loopback kernel that also sends every line to
                # each peer's diagnostic area (never read): what outstanding
                # remote stores cost a kernel that does not wait for a peer.
                "diag.one_shot_ll_send_loopback": "one_shot_ll_send_loopback",
                # Diagnostic: the call-trace variant of one_shot_ll.
                "diag.one_shot_ll_traced": "one_shot_ll_traced",
                # The run-time world-size variant (used for world sizes other
                # than 2, 4, 8), measured and checked on this machine.
                "diag.one_shot_ll_generic": "one_shot_ll_generic",
                # The grid rule with 128 or 256 lines per block instead of 64.
                "diag.one_shot_ll_b128": "one_shot_ll_b128",
                "diag.one_shot_ll_b256": "one_shot_ll_b256"}
# Kernel-level rows whose outputs are each rank's own input summed world-size
# times (no data crosses between ranks).
_LOOPBACK_IMPLS = ("diag.one_shot_ll_loopback", "diag.one_shot_ll_send_loopback")
_DTYPE_CODES = {np.dtype(np.float32): 0, np.dtype(ml_dtypes.bfloat16): 1,
                np.dtype(np.float16): 2}


def run_kernel_level(args) -> dict:
  """BENCHMARK.md level 1: `iters` back-to-back calls captured in one CUDA
  graph per rank, all ranks launched together; per call = max over ranks of
  elapsed / iters; median (and min) over `rounds` replays."""
  from jax_llar import comm
  mod = _ext.load()
  if mod is None:
    raise SystemExit("kernel level needs the CUDA extension and 2+ CUDA GPUs: "
                     f"{_ext.reason()}")
  devices = jax.devices()[: args.world or jax.device_count()]
  cs = comm.get_or_create([[d.local_hardware_id for d in devices]])
  rng = np.random.default_rng(args.seed)
  rows = []
  impls = [i for i in args.impls.split(",") if i in KERNEL_IMPLS] or list(KERNEL_IMPLS)
  if "diag.one_shot_ll_traced" in impls:
    # The trace variant then stores its timestamps, as it would in use.
    mod.enable_call_trace(cs.comm_id)
  for dt_name in args.dtypes:
    dtype = DTYPES[dt_name]
    for nbytes in args.sizes:
      n = max(1, nbytes // dtype.itemsize)
      inputs = [testing.random_array(rng, (n,), dtype) for _ in devices]
      expect = testing.rank_order_sum(inputs, dtype)
      for impl in impls:
        if (KERNEL_IMPLS[impl].startswith("one_shot_ll") and
            n * dtype.itemsize > jax_llar.config.ONE_SHOT_LIMIT_BYTES):
          continue
        iters = 200 if impl == "nccl.allreduce" else args.kernel_iters
        us, outs = mod.kernel_bench(cs.comm_id, KERNEL_IMPLS[impl], _DTYPE_CODES[dtype],
                                    [x.tobytes() for x in inputs], iters, args.rounds)
        outs = [np.frombuffer(o, dtype) for o in outs]
        if impl == "kernel.copy":
          correct = all(testing.bitwise_equal(o, x) for o, x in zip(outs, inputs))
        elif impl in _LOOPBACK_IMPLS:
          correct = all(testing.bitwise_equal(
              o, testing.rank_order_sum([x] * len(devices), dtype))
              for o, x in zip(outs, inputs))
        elif impl != "nccl.allreduce" or len(devices) == 2:
          correct = all(testing.bitwise_equal(o, expect) for o in outs)
        else:  # NCCL's ring order is not rank order beyond two ranks
          correct = all(np.allclose(o.astype(np.float64), expect.astype(np.float64),
                                    rtol=1e-2) for o in outs)
        per_rep = [max(r) for r in us]
        row = {"impl": impl, "world_size": len(devices), "dtype": str(dtype),
               "bytes_per_rank": n * dtype.itemsize,
               "us_per_call": statistics.median(per_rep), "us_min": min(per_rep),
               "us_max": max(per_rep), "iters": iters, "reps": args.rounds,
               "correct": bool(correct)}
        rows.append(row)
        print(f"{impl:30s} {dt_name:5s} {row['bytes_per_rank']:9d} B "
              f"{row['us_per_call']:8.2f} us/call [min {row['us_min']:.2f}] "
              f"correct={row['correct']}", flush=True)
  return {"env": environment(), "level": "kernel", "rows": rows}


def run_jax_level(args) -> dict:
  devices = jax.devices()
  if len(devices) < 2:
    raise SystemExit("jax level needs at least 2 devices")
  mesh = Mesh(np.array(devices[: args.world or len(devices)]), ("x",))
  rng = np.random.default_rng(args.seed)
  rows = []
  for dt_name in args.dtypes:
    dtype = DTYPES[dt_name]
    for nbytes in args.sizes:
      size_rows = measure(args.impls.split(","), mesh, dtype, nbytes, args.k_short,
                          args.k_long, args.calls, args.rounds, rng,
                          timeline=nbytes <= args.timeline_max_bytes)
      for row in size_rows:
        impl = row["impl"]
        rows.append(row)
        note = ("  (negative slope: timing noise; use longer chains or more calls)"
                if row["us_per_call"] < 0 else "")
        print(f"{impl:22s} {dt_name:5s} {row['bytes_per_rank']:8d} B "
              f"{row['us_per_call']:8.2f} us/step [{row['us_round_min']:.2f}, "
              f"{row['us_round_max']:.2f}] correct={row['correct']} "
              f"fast_path={row['fast_path']}{note}", flush=True)
  anatomy = None  # last: it turns the call trace on for later programs
  if args.anatomy_bytes and _ext.load() is not None and devices[0].platform == "gpu":
    anatomy = call_anatomy(mesh, DTYPES[args.dtypes[0]], args.anatomy_bytes,
                           args.k_short, args.k_long, rng)
    for key, v in anatomy.items():
      for dev, g in v["per_gpu"].items():
        print(f"anatomy {key:22s} {dev}: per step, host before "
              f"{g['pre_us_per_step']:6.2f} us, device {g['span_us_per_step']:6.2f} us, "
              f"host after {g['post_us_per_step']:6.2f} us  correct={v['correct']}",
              flush=True)
  elif args.anatomy_bytes:
    print("--anatomy-bytes: skipped (needs the CUDA extension and CUDA GPUs)", flush=True)
  failures = []
  if args.psum_flags:
    flag_rows, failures = run_psum_flag_baselines(args)
    rows += flag_rows
  return {"env": environment(), "level": "jax", "rows": rows,
          "psum_flag_failures": failures, "call_anatomy": anatomy,
          "dispatch": [d.__dict__ for d in jax_llar.dispatch_log()
                       if d.reason != "platform"][-50:]}


def main(argv=None):
  p = argparse.ArgumentParser(
      prog="python -m jax_llar.bench",
      description=__doc__.splitlines()[0] + " Times are microseconds per step "
      "(jax) or per call (kernel). Needs 2+ CUDA GPUs for meaningful numbers; on "
      "CPU the llar rows fall back to lax.psum (marked '*').",
      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  p.add_argument("--level", choices=["jax", "kernel"], default="jax",
                 help="jax: jitted shard_map chains (slope method); kernel: CUDA "
                      "graphs of back-to-back calls without XLA")
  p.add_argument("--kernel-iters", type=int, default=1000,
                 help="calls captured per graph at the kernel level")
  p.add_argument("--sizes", type=lambda s: [int(v) for v in s.split(",")],
                 default=list(DEFAULT_SIZES), help="bytes per rank, comma separated")
  p.add_argument("--dtypes", type=_dtypes_arg, default="f32,bf16",
                 help="comma separated: f32, bf16, f16")
  p.add_argument("--impls", default="",
                 help=f"comma separated; jax level: {','.join(IMPLS)} (and the "
                      "diagnostic diag.custom_call_copy_wide); kernel level: "
                      f"{','.join(KERNEL_IMPLS)} (empty: all)")
  p.add_argument("--k-short", type=int, default=32, help="short chain length (jax level)")
  p.add_argument("--k-long", type=int, default=512, help="long chain length (jax level)")
  p.add_argument("--calls", type=int, default=120,
                 help="timed calls per chain length and impl (BENCHMARK.md: >= 40)")
  p.add_argument("--rounds", type=int, default=6,
                 help="interleaved timing rounds (jax) / graph replays (kernel)")
  p.add_argument("--world", type=int, default=0, help="devices to use (0: all)")
  p.add_argument("--timeline-max-bytes", type=int, default=4096,
                 help="also read the per-step device period from a profiler "
                      "trace at sizes up to this (jax level, not lax.psum)")
  p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
  p.add_argument("--psum-flags", action="store_true",
                 help="also time lax.psum under each XLA flag of MEASURED.md, each "
                      "in its own subprocess (jax level)")
  p.add_argument("--anatomy-bytes", type=int, default=0,
                 help="also split the wall time of one call into host time before "
                      "the first all-reduce kernel, device span and host time after "
                      "(kernels' call trace), at this size per rank (0: off)")
  p.add_argument("--flag-timeout", type=int, default=600,
                 help="seconds allowed per flag subprocess")
  p.add_argument("--out", default="benchmarks/results",
                 help="folder for <machine>-<yyyymmdd>-<level><tag>.json/.png")
  p.add_argument("--tag", default="", help="suffix for the result file name")
  args = p.parse_args(argv)
  if args.level == "jax" and not _host.gpu_present() and _host.force_host_devices(2):
    print("jax_llar.bench: no GPU here; running on 2 forced CPU devices "
          "(XLA_FLAGS=--xla_force_host_platform_device_count=2)", flush=True)
  if args.level == "kernel":
    result = run_kernel_level(args)
  else:
    args.impls = args.impls or ",".join(IMPLS)
    result = run_jax_level(args)
  os.makedirs(args.out, exist_ok=True)
  stem = f"{machine_name()}-{datetime.date.today():%Y%m%d}-{args.level}{args.tag}"
  with open(os.path.join(args.out, stem + ".json"), "w") as f:
    json.dump(result, f, indent=1)
  saved = [stem + ".json"]
  try:
    plot(result["rows"], os.path.join(args.out, stem + ".png"), machine_name())
    saved.append(stem + ".png")
  except ImportError:
    print("matplotlib missing: no plot (pip install matplotlib)", file=sys.stderr)
  if args.level == "jax":
    print_table(result["rows"])
  print(f"saved {', '.join(os.path.join(args.out, f) for f in saved)}")
  bad = [r for r in result["rows"] if not r["correct"]]
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main())
