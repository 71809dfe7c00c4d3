r"""Write a profiler trace of a jitted shard_map step and find jax_llar in it.

  python examples/profile_trace.py [--out /tmp/jax_llar_trace] [--calls 5]

The step multiplies by a matrix and all-reduces the result in each of
several sizes (``--sizes``, bytes per rank, bf16), through ``lax.psum``
inside ``jax_llar.swap_psum()``. The trace is written by
``jax.profiler.trace`` (an XSpace ``.xplane.pb`` and a Perfetto
``perfetto_trace.json.gz``) and read back with the profiler's own reader
(``jax.profiler.ProfileData``, through ``jax_llar.tools.traces``). The script
prints each event that names jax_llar: the op name of every fast-path call
(``jax_llar.<algorithm>.<dtype>.<bytes>B.<ranks>ranks``, in XLA's metadata)
and the kernels (``OneShotLLKernel<dtype, ranks, ...>``), then how to open
the trace:

  xprof --logdir /tmp/jax_llar_trace        (or tensorboard --logdir with
                                              tensorboard-plugin-profile)
  https://ui.perfetto.dev                   open perfetto_trace.json.gz

Without GPUs (``--cpu_devices N`` forces N host devices) every psum is
JAX's, and the script says that no jax_llar event was found.
"""

from __future__ import annotations

import glob
import json
import os

from absl import app, flags

from jax_llar.tools import _cli, host

OUT = flags.DEFINE_string("out", "/tmp/jax_llar_trace", "Folder the trace is written to.")
CALLS = flags.DEFINE_integer("calls", 5, "Traced calls of the step (after one warm-up call).",
                             lower_bound=1)
SIZES = flags.DEFINE_list("sizes", ["1024", "16384"], "Bytes per rank of each all-reduce "
                          "of the step (bf16).")
CPU_DEVICES = flags.DEFINE_integer("cpu_devices", 0, "Force this many host CPU devices "
                                   "(0: the default backend where there is a GPU, else "
                                   "2 CPU devices, as the other examples).", lower_bound=0)
JSON_F = flags.DEFINE_string("json", None, "Also write what was found to this file.")


def _sizes() -> list[int]:
  try:
    sizes = [int(s) for s in SIZES.value]
  except ValueError as e:
    raise app.UsageError(f"--sizes: integers expected ({e})") from None
  if not sizes or any(s < 2 or s % 2 for s in sizes):
    raise app.UsageError("--sizes: even byte counts of at least 2 (bf16 elements)")
  return sizes


def main() -> int:
  sizes = _sizes()
  n_cpu = CPU_DEVICES.value
  if not n_cpu and not host.gpu_present():
    n_cpu = 2  # a psum over one device shows no fallback reason worth seeing
  if n_cpu:
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               f" --xla_force_host_platform_device_count={n_cpu}")
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax import lax  # pylint: disable=g-import-not-at-top
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top

  import jax_llar  # pylint: disable=g-import-not-at-top
  from jax_llar.tools import traces  # pylint: disable=g-import-not-at-top

  mesh = Mesh(np.array(jax.devices()), ("x",))
  n = mesh.size
  rng = np.random.default_rng(0)
  xs = [jax.device_put(rng.standard_normal((n, s // 2)).astype(jnp.bfloat16),
                       NamedSharding(mesh, P("x"))) for s in sizes]
  w = jnp.asarray(rng.standard_normal((8,)).astype(np.float32)).astype(jnp.bfloat16)

  def body(*vs):
    return tuple(lax.psum(v * w[0] + w[1], "x") for v in vs)

  step = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("x"),) * len(xs),
                               out_specs=(P(),) * len(xs)))
  with jax_llar.swap_psum():
    jax.block_until_ready(step(*xs))  # compile and warm up
    with jax.profiler.trace(OUT.value, create_perfetto_trace=True):
      for _ in range(CALLS.value):
        jax.block_until_ready(step(*xs))

  decisions = [d.to_dict() for d in jax_llar.dispatch_log()]
  events = traces.read(OUT.value, stats=True)
  found = []
  for e in events:
    named = [(k, v) for k, v in e.stats if "jax_llar" in v]
    if "jax_llar" in e.name or traces.KERNELS.search(e.name) or named:
      found.append({"process": e.process, "thread": e.thread, "name": e.name,
                    "dur_us": round(e.dur, 3), "stats": dict(named)})
  op_names = sorted({v for f in found for v in f["stats"].values()} |
                    {f["name"] for f in found if "jax_llar" in f["name"]})
  kernels = sorted({f["name"] for f in found if traces.KERNELS.search(f["name"])})
  perfetto = glob.glob(os.path.join(OUT.value, "**", "perfetto_trace.json.gz"),
                       recursive=True)

  print(f"devices: {n} x {jax.devices()[0].device_kind}; decisions: "
        + ", ".join(f"{d['bytes_per_rank']} B -> {d['impl']} ({d['reason']})"
                    for d in decisions))
  print(f"trace: {traces.find_xplane(OUT.value)}")
  if found:
    print(f"{len(found)} events name jax_llar; op names:")
    for name in op_names:
      print(f"  {name}")
    print("kernels:")
    for name in kernels:
      print(f"  {name}")
  else:
    print("no event names jax_llar: every psum of this run lowered as JAX's "
          "(see the decisions above)")
  print(f"open it: xprof --logdir {OUT.value}   (or tensorboard --logdir {OUT.value})")
  if perfetto:
    print(f"         https://ui.perfetto.dev and open {perfetto[0]}")
  if JSON_F.value:
    with open(JSON_F.value, "w") as f:
      json.dump({"devices": n, "decisions": decisions, "op_names": op_names,
                 "kernels": kernels, "events": found[:200],
                 "xplane": traces.find_xplane(OUT.value),
                 "perfetto": perfetto[0] if perfetto else None}, f, indent=1)
  return 0


if __name__ == "__main__":
  _cli.run(main)
