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

On one GPU, ``--loopback W`` runs the same step on a loopback group instead
(``jax_llar.tools.loopback.group``: W simulated ranks of one process on the
one device, the production kernels behind the tools module's FFI target):
its calls are named ``jax_llar.loopback.<algorithm>.<dtype>.<bytes>B.<W>ranks``
and every rank's kernel runs on the one GPU. ``--picture FILE`` draws the
last traced step's ops and kernels on the device's timeline (matplotlib,
from the trace's events), captioned with what ran.
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
LOOPBACK = flags.DEFINE_integer("loopback", 0, "On one GPU: run the step on a loopback group "
                                "of this many simulated ranks (2-8) instead of a shard_map "
                                "over the devices (0: shard_map).", lower_bound=0, upper_bound=8)
PICTURE = flags.DEFINE_string("picture", None, "Draw the last traced step's ops and kernels "
                              "on the device timeline into this image file (PNG, SVG).")


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
  if LOOPBACK.value == 1:
    raise app.UsageError("--loopback: 2-8 simulated ranks (0: shard_map)")
  if LOOPBACK.value and (CPU_DEVICES.value or not host.gpu_present()):
    raise app.UsageError("--loopback needs a CUDA GPU (and no --cpu_devices)")
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

  rng = np.random.default_rng(0)
  w = jnp.asarray(rng.standard_normal((8,)).astype(np.float32)).astype(jnp.bfloat16)
  group = None
  if LOOPBACK.value:
    from jax_llar.tools.loopback.group import LoopbackGroup  # pylint: disable=g-import-not-at-top
    group = LoopbackGroup(LOOPBACK.value, algorithms=("one_shot_ll",))
    n = group.world
    # Row r of each operand is simulated rank r's input.
    xs = [jax.device_put(rng.standard_normal((n, s // 2)).astype(jnp.bfloat16), group.device)
          for s in sizes]
    # An exact scaling before each call, so that the check below is exact.
    step = jax.jit(lambda *vs: tuple(group.psum(v * 0.5) for v in vs))
  else:
    mesh = Mesh(np.array(jax.devices()), ("x",))
    n = mesh.size
    xs = [jax.device_put(rng.standard_normal((n, s // 2)).astype(jnp.bfloat16),
                         NamedSharding(mesh, P("x"))) for s in sizes]

    def body(*vs):
      return tuple(lax.psum(v * w[0] + w[1], "x") for v in vs)

    step = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("x"),) * len(xs),
                                 out_specs=(P(),) * len(xs)))
  with jax_llar.swap_psum():
    outs = jax.block_until_ready(step(*xs))  # compile and warm up
    with jax.profiler.trace(OUT.value, create_perfetto_trace=True):
      for _ in range(CALLS.value):
        jax.block_until_ready(step(*xs))
  if group is not None:
    # The step's result, checked: every simulated rank's row is the rank-order sum.
    from jax_llar import testing  # pylint: disable=g-import-not-at-top
    for x, y in zip(xs, outs):
      v = np.asarray(x) * np.asarray(0.5, x.dtype)
      want = testing.rank_order_sum(list(v), v.dtype)
      if not all(testing.bitwise_equal(row, want) for row in np.asarray(y)):
        raise SystemExit("the loopback group's result differs from the rank-order sum")
    codes = [r["code"] for r in group.records()]
    group.close()
    if any(codes):
      raise SystemExit(f"a simulated rank reported an error: {codes}")

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

  if group is not None:
    print(f"loopback group: {n} simulated ranks on one {jax.devices()[0].device_kind} "
          "(results checked against the rank-order sum)")
  else:
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
  if PICTURE.value:
    caption = (f"loopback group: {n} simulated ranks on one GPU (not NVLink)" if group
               else f"{n} x {jax.devices()[0].device_kind}")
    print(f"picture: {draw(events, PICTURE.value, caption)}")
  if JSON_F.value:
    with open(JSON_F.value, "w") as f:
      json.dump({"devices": n, "decisions": decisions, "op_names": op_names,
                 "kernels": kernels, "events": found[:200],
                 "xplane": traces.find_xplane(OUT.value),
                 "perfetto": perfetto[0] if perfetto else None}, f, indent=1)
  return 0


def draw(events, path: str, caption: str) -> str:
  """Draws the last traced step on the device's timeline into `path`: one
  lane per device stream, XLA's ops that name jax_llar above their kernels;
  returns `path`."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  from jax_llar.tools import traces  # pylint: disable=g-import-not-at-top

  device = [e for e in events if e.process.startswith("/device:") and e.dur > 0]
  ours = [e for e in device if traces.ours(e) or "jax_llar" in e.name]
  if not ours:
    raise SystemExit("--picture: no device event of jax_llar's in the trace")
  # The last step: the events from the last kernel's start minus one step's span.
  kernels = sorted((e for e in device if traces.ours(e)), key=lambda e: e.ts)
  per_step = max(1, len(kernels) // CALLS.value)
  first = kernels[-per_step].ts if kernels else ours[-1].ts
  t0 = first - 5.0
  t1 = max(e.ts + e.dur for e in kernels[-per_step:]) + 5.0 if kernels else first + 50
  shown = [e for e in device if e.ts + e.dur >= t0 and e.ts <= t1]
  lanes = sorted({(e.process, e.thread) for e in shown})
  fig, ax = plt.subplots(figsize=(11, 0.6 + 0.55 * len(lanes)))
  for k, lane in enumerate(lanes):
    for e in (e for e in shown if (e.process, e.thread) == lane):
      mine = traces.ours(e) or "jax_llar" in e.name
      ax.broken_barh([(e.ts - t0, e.dur)], (k - 0.35, 0.7),
                     facecolors="tab:orange" if mine else "tab:gray", edgecolor="black",
                     linewidth=0.3)
      if mine and e.dur > (t1 - t0) / 40:
        label = e.name.split("<")[0].split("(")[0][:40]
        ax.text(e.ts - t0 + e.dur / 2, k, label, ha="center", va="center", fontsize=6)
  ax.set_yticks(range(len(lanes)))
  ax.set_yticklabels([f"{p} {t}"[:48] for p, t in lanes], fontsize=7)
  ax.set_xlabel("microseconds from the step's first jax_llar kernel - 5 us")
  ax.set_title(f"One traced step, jax_llar's kernels in orange. {caption}", fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=150)
  plt.close(fig)
  return path


if __name__ == "__main__":
  _cli.run(main)
