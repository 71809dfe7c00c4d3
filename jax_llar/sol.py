"""Speed of light: ``python -m jax_llar.sol [--kernel-us US]`` (BENCHMARK.md level 4).

Measures, with one GPU thread and device timestamps (%globaltimer):
  fence_ns          ``__threadfence()`` per call
  fence_system_ns   ``__threadfence_system()`` per call
  l2_chase_ns       dependent ``ld.global.cg`` loads over 8 MiB (L2 hits)
  remote_4b_ns      a 4-byte store until the peer sees it (half a ping-pong)
  remote_ll_ns      the same with one 16-byte LL line ``{d0, flag, d1, flag}``
  fanout_ll_ns[k-1] the same when the sender stores to k peers and waits for
                    all k echoes (k = 1 .. N-1): does latency grow with N?
  empty_kernel_graph_us  per empty kernel, 1,000 of them in one CUDA graph
and prints the two speed-of-light estimates of arXiv 2607.16100's model,
``L_SoL = 2 * L_L2 + L_remote`` with ``L_L2`` = the fence (the paper's choice)
or the pointer chase, using the LL-line remote latency, in microseconds.
With ``--kernel-us`` (or the smallest one-shot row of a kernel-level result
file given by ``--kernel-json``) it prints the ratio to both.
Results go to ``<out>/<machine>-<yyyymmdd>-sol.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import jax

from jax_llar import _ext, bench


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--iters", type=int, default=10_000)
  p.add_argument("--kernel-us", type=float, default=None,
                 help="a measured one-shot time to compare (microseconds)")
  p.add_argument("--kernel-json", default="",
                 help="kernel-level result file; its smallest llar.one_shot_ll row is compared")
  p.add_argument("--out", default="benchmarks/results")
  args = p.parse_args(argv)
  mod = _ext.load()
  if mod is None:
    raise SystemExit(f"jax_llar.sol needs the CUDA extension: {_ext.reason()}")
  ordinals = [d.local_hardware_id for d in jax.devices()]
  r = dict(mod.sol(ordinals, args.iters))
  remote = r["remote_ll_ns"]
  sol_fence = (2 * r["fence_ns"] + remote) / 1000 if remote else None
  sol_chase = (2 * r["l2_chase_ns"] + remote) / 1000 if remote else None
  kernel_us, kernel_src = args.kernel_us, "--kernel-us"
  if kernel_us is None and args.kernel_json:
    rows = [x for x in json.load(open(args.kernel_json))["rows"]
            if x["impl"] == "llar.one_shot_ll"]
    if rows:
      best = min(rows, key=lambda x: x["bytes_per_rank"])
      kernel_us = best["us_per_call"]
      kernel_src = f"{args.kernel_json} ({best['dtype']}, {best['bytes_per_rank']} B)"
  out = {"env": bench.environment(), "level": "sol", "iters": args.iters,
         "measured": r, "sol_us_fence": sol_fence, "sol_us_chase": sol_chase,
         "kernel_us": kernel_us, "kernel_source": kernel_src if kernel_us else None,
         "rows": []}
  for k, v in enumerate(r["fanout_ll_ns"], start=1):
    out["rows"].append({"impl": "sol.fanout_ll", "world_size": len(ordinals),
                        "peers": k, "us_per_call": v / 1000})
  for name, v in r.items():
    if name != "fanout_ll_ns":
      print(f"{name:24s} {v}")
  if sol_fence:
    print(f"SoL (2 x fence + remote LL)        {sol_fence:.3f} us")
    print(f"SoL (2 x L2 chase + remote LL)     {sol_chase:.3f} us")
    if kernel_us:
      print(f"one-shot kernel {kernel_us:.2f} us ({kernel_src}): "
            f"{kernel_us / sol_fence:.2f}x / {kernel_us / sol_chase:.2f}x the two SoL estimates")
  os.makedirs(args.out, exist_ok=True)
  path = os.path.join(args.out, f"{bench.machine_name()}-{datetime.date.today():%Y%m%d}-sol.json")
  with open(path, "w") as f:
    json.dump(out, f, indent=1)
  print(f"saved {path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
