"""HBM bandwidth per device, for the weight-read floor of the decode step.

  python examples/tp_decode/hbm.py   (on a GPU: how the read figure spreads)
"""

from __future__ import annotations

import statistics
import time


def measure_bandwidth(mesh, nbytes: int, calls: int = 10, rounds: int = 3) -> dict:
  """HBM bandwidth per device from large bfloat16 kernels, each device on
  its own `nbytes` array: ``copy_gbs`` from an elementwise multiply (bytes
  read + written per second) and ``read_gbs`` from a sum (bytes read per
  second). Each is the slope between programs of 1 and 5 kernels separated
  by optimisation barriers (median of `calls` calls each, alternating), so
  that a call's fixed cost cancels; the best of `rounds` such measurements
  (the highest bandwidth: a floor divided by it is the lowest), every
  round's figure kept in ``copy_gbs_rounds`` and ``read_gbs_rounds``. GB =
  1e9 bytes.

  On a GPU the read figure is then taken from device time instead
  (`device_read`): the sums' kernels' own durations in a profiler trace,
  which host timing's jitter does not reach (a host-timed round once read
  4856 GB/s, above H200's 4.8 TB/s; benchmarks/NOTES.md). ``read_basis``
  says which: "device" (``read_gbs`` is the device figure and
  ``read_gbs_host`` the host-timed one) or "host"."""
  import jax
  import jax.numpy as jnp
  from jax import lax
  from jax.sharding import NamedSharding, PartitionSpec as P
  n = nbytes // 2
  x = jax.jit(lambda: jnp.ones((mesh.size * n,), jnp.bfloat16),
              out_shardings=NamedSharding(mesh, P("tp")))()

  def prog(kind, k):
    def body(v):
      acc = jnp.zeros((), jnp.float32)
      for i in range(k):
        if kind == "copy":
          v = lax.optimization_barrier(v * jnp.bfloat16(1.0 + 2.0 ** -7 * (i + 1)))
        else:
          v, acc = lax.optimization_barrier((v, acc + jnp.sum(v, dtype=jnp.float32)))
      return v[:1].astype(jnp.float32) + acc
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("tp"), out_specs=P("tp"),
                                 check_vma=False))

  out = {"bytes_per_device": n * 2, "rounds": rounds}
  progs = {kind: (prog(kind, 1), prog(kind, 5)) for kind in ("copy", "read")}
  for f1, f5 in progs.values():
    f1(x).block_until_ready()
    f5(x).block_until_ready()
  for kind, moved in (("copy", 4 * n), ("read", 2 * n)):
    f1, f5 = progs[kind]
    figures = []
    for _ in range(rounds):
      t1, t5 = [], []
      for _ in range(calls):
        for f, ts in ((f1, t1), (f5, t5)):
          t0 = time.perf_counter()
          f(x).block_until_ready()
          ts.append(time.perf_counter() - t0)
      per_kernel = (statistics.median(t5) - statistics.median(t1)) / 4
      figures.append(moved / per_kernel / 1e9 if per_kernel > 0 else float("nan"))
    out[f"{kind}_gbs_rounds"] = figures
    finite = [g for g in figures if g == g]
    out[f"{kind}_gbs"] = max(finite) if finite else float("nan")
  out["read_basis"] = "host"
  on_gpu = mesh.devices.flat[0].platform == "gpu"
  device = device_read(progs["read"][1], x, 2 * n) if on_gpu else None
  if device is not None:
    out["read_gbs_host"] = out["read_gbs"]
    out.update(read_gbs=device["best_gbs"], read_gbs_device=device, read_basis="device")
  del x
  return out


def device_read(f, x, nbytes: int, calls: int = 3) -> dict | None:
  """Read bandwidth of the sums of ``f(x)`` (each reading `nbytes` per
  device) from their kernels' durations on the device, `calls` calls under
  ``jax.profiler`` (read with ``jax_llar.tools.traces``): the kernels that
  take at least half as long as the longest are the passes that read the
  array. Returns ``{"best_gbs", "median_gbs", "kernels"}`` (the highest and
  the median over those kernels), or None when the trace holds no device
  kernel."""
  from jax_llar.tools import traces
  events = [e for e in traces.profile(f, x, calls=calls)
            if e.process.startswith(traces.DEVICE_PREFIX) and e.dur > 0]
  if not events:
    return None
  longest = max(e.dur for e in events)
  gbs = [nbytes / (e.dur * 1e-6) / 1e9 for e in events if e.dur >= longest / 2]
  return {"best_gbs": max(gbs), "median_gbs": statistics.median(gbs), "kernels": len(gbs)}


def spread(nbytes: int = 1 << 30, repeats: int = 2, rounds: int = 6) -> None:
  """Prints how the read figure spreads on this process's first device:
  `measure_bandwidth`'s host-timed rounds and its device-timed figure,
  `repeats` times, and a host-timed slope of 1 against 9 sums on random
  data (20 calls a point, `rounds` rounds)."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax import lax
  from jax.sharding import Mesh
  mesh = Mesh(np.array(jax.devices()[:1]), ("tp",))
  for _ in range(repeats):
    bw = measure_bandwidth(mesh, nbytes, rounds=rounds)
    print("measure_bandwidth: host-timed read rounds", [round(v) for v in bw["read_gbs_rounds"]],
          "GB/s; copy rounds", [round(v) for v in bw["copy_gbs_rounds"]],
          f"GB/s; read {bw['read_gbs']:.0f} GB/s ({bw['read_basis']}-timed)", flush=True)
  n = nbytes // 2
  x = jax.random.normal(jax.random.key(0), (n,), jnp.bfloat16)

  def prog(k):
    def body(v):
      acc = jnp.zeros((), jnp.float32)
      for _ in range(k):
        v, acc = lax.optimization_barrier((v, acc + jnp.sum(v, dtype=jnp.float32)))
      return acc
    return jax.jit(body)

  f1, f9 = prog(1), prog(9)
  f1(x).block_until_ready()
  f9(x).block_until_ready()
  out = []
  for _ in range(rounds):
    t1, t9 = [], []
    for _ in range(20):
      for f, ts in ((f1, t1), (f9, t9)):
        t0 = time.perf_counter()
        f(x).block_until_ready()
        ts.append(time.perf_counter() - t0)
    out.append(2 * n / ((statistics.median(t9) - statistics.median(t1)) / 8) / 1e9)
  print("slope of 1 against 9 sums, random data: read rounds", [round(v) for v in out], "GB/s")


if __name__ == "__main__":
  spread()
