"""Speed of light: what the hardware allows a one-shot all-reduce.

  python -m jax_llar.tools.sol [--kernel_us US | --kernel_json FILE]

Needs 2+ CUDA GPUs and the CUDA extension. Measures, with one GPU thread and
device timestamps from the GPU's global timer:

  fence_ns               one __threadfence() per call
  fence_system_ns        one __threadfence_system() per call
  l2_chase_ns            a dependent ld.global.cg load over 8 MiB (L2 hits)
  remote_4b_ns           a 4-byte store until the peer sees it (half a ping-pong)
  remote_ll_ns           the same with one 16-byte LL line {d0, flag, d1, flag}
  fanout_ll_ns[k-1]      the same when the sender stores to k peers and waits
                         for all k echoes (k = 1 .. N-1)
  empty_kernel_graph_us  per empty kernel, 1,000 of them in one CUDA graph

and prints the two speed-of-light estimates of the model of arXiv
2607.16100, L_SoL = 2 x L_L2 + L_remote, with L_L2 the fence (the paper's
choice) or the pointer chase, and L_remote the LL-line latency, in
microseconds. Given a measured one-shot time (--kernel_us), or a
kernel-level result file (--kernel_json), it prints the ratio to both
estimates of every all-reduce in the file (each algorithm of jax_llar,
llar.*, and NCCL's, nccl.*) at its smallest size measured, where the
latency model applies. The result goes to
OUT/<machine>-<yyyymmdd>-sol.json, written atomically. The method:
benchmarks/METHOD.md in the repository.

With one GPU the local probes run and the remote ones cannot: remote_4b_ns
and remote_ll_ns print "not measured (needs 2 GPUs)" and are null in the
JSON, fanout_ll_ns is empty, and no speed-of-light estimate is made (none
is a zero latency). --kernel_json must name a readable result file; the
output folder must be writable; both are checked before the probes run.
"""

from __future__ import annotations

from absl import flags

from jax_llar.tools import _cli, _native, report

ITERS = flags.DEFINE_integer("iters", 10_000, "Repetitions of each probe.", lower_bound=1,
                             upper_bound=10_000_000)
KERNEL_US = flags.DEFINE_float("kernel_us", None,
                               "A measured one-shot time to compare, microseconds per call "
                               "(positive).", lower_bound=1e-6, upper_bound=1e9)
KERNEL_JSON = flags.DEFINE_string(
    "kernel_json", None,
    "A kernel-level result file (python -m jax_llar.tools.bench --level kernel); "
    "the smallest-size row of each of its all-reduces (llar.*, nccl.*) is compared.")
OUT = flags.DEFINE_string(
    "out", report.default_out_dir(),
    report.OUT_HELP)
flags.mark_flags_as_mutual_exclusive(["kernel_us", "kernel_json"])

# The probes that need a second GPU (None in the record with one GPU).
REMOTE = ("remote_4b_ns", "remote_ll_ns")
NOT_MEASURED = "not measured (needs 2 GPUs)"


def unmeasured_as_none(r: dict, devices: int) -> dict:
  """The native probes' record `r` with the remote probes None where fewer
  than 2 `devices` ran them (the native code leaves them 0, which is no
  latency)."""
  r = dict(r)
  if devices < 2:
    for key in REMOTE:
      r[key] = None
    r["fanout_ll_ns"] = []
  return r


def measured_lines(r: dict) -> list[str]:
  """The printed lines of the probes' record (`unmeasured_as_none`'s): one
  per probe, `NOT_MEASURED` for a None."""
  lines = [f"{name:24s} {NOT_MEASURED if v is None else v}"
           for name, v in r.items() if name != "fanout_ll_ns"]
  fanout = r.get("fanout_ll_ns")
  lines.append(f"{'fanout_ll_ns':24s} {fanout if fanout else NOT_MEASURED}")
  return lines


def kernel_figures(kernel_us: float | None,
                   kernel_json: str | None) -> list[tuple[str, float, str]]:
  """The kernel times to compare: [(impl, us per call, where it came from)].

  `kernel_us` as given (impl llar.one_shot_ll); else, for every all-reduce of
  `kernel_json` (impls llar.* and nccl.*; the diagnostic and copy rows are no
  all-reduce), its smallest-size row that passed its correctness check. In
  the file's order of impls.

  Raises:
    jax_llar.tools._cli.Refused: `kernel_json` is missing, not JSON or not
      a kernel-level result file.
  """
  if kernel_us is not None:
    return [("llar.one_shot_ll", kernel_us, "--kernel_us")]
  if not kernel_json:
    return []
  doc = _cli.readable_json(kernel_json, "kernel_json", key="rows")
  try:
    rows = [x for x in doc["rows"]
            if x["impl"].startswith(("llar.", "nccl.")) and x.get("correct", True)
            and isinstance(x["us_per_call"], (int, float))
            and isinstance(x["bytes_per_rank"], int)]
  except (KeyError, TypeError, AttributeError):
    raise _cli.Refused(f"--kernel_json={kernel_json}: its rows are not a kernel-level "
                       "result's (impl, bytes_per_rank, us_per_call)") from None
  out = []
  for impl in dict.fromkeys(x["impl"] for x in rows):
    best = min((x for x in rows if x["impl"] == impl), key=lambda x: x["bytes_per_rank"])
    out.append((impl, best["us_per_call"],
                f"{kernel_json} ({best['dtype']}, {best['bytes_per_rank']} B)"))
  return out


def main() -> int:
  kernels = kernel_figures(KERNEL_US.value, KERNEL_JSON.value)  # refused before the probes
  out_dir = _cli.writable_folder(OUT.value)
  import jax
  try:
    mod = _native.require("python -m jax_llar.tools.sol")
  except RuntimeError as e:
    print(e)
    return 1
  ordinals = [d.local_hardware_id for d in jax.devices()]
  r = unmeasured_as_none(dict(mod.sol(ordinals, ITERS.value)), len(ordinals))
  remote = r["remote_ll_ns"]
  sol_fence = (2 * r["fence_ns"] + remote) / 1000 if remote else None
  sol_chase = (2 * r["l2_chase_ns"] + remote) / 1000 if remote else None
  out = {"env": report.environment(), "level": "sol", "iters": ITERS.value,
         "measured": r, "sol_us_fence": sol_fence, "sol_us_chase": sol_chase,
         "kernels": [{"impl": i, "us_per_call": us, "source": src,
                      "x_sol_fence": us / sol_fence if sol_fence else None,
                      "x_sol_chase": us / sol_chase if sol_chase else None}
                     for i, us, src in kernels],
         "rows": []}
  for k, v in enumerate(r["fanout_ll_ns"], start=1):
    out["rows"].append({"impl": "sol.fanout_ll", "world_size": len(ordinals),
                        "peers": k, "us_per_call": v / 1000})
  for line in measured_lines(r):
    print(line)
  if sol_fence:
    print(f"SoL (2 x fence + remote LL)        {sol_fence:.3f} us")
    print(f"SoL (2 x L2 chase + remote LL)     {sol_chase:.3f} us")
    for impl, us, src in kernels:
      print(f"{impl:28s} {us:7.2f} us ({src}): {us / sol_fence:.2f}x / "
            f"{us / sol_chase:.2f}x the two SoL estimates")
  else:
    print(f"SoL: not estimated: the remote LL latency needs 2 GPUs ({len(ordinals)} here)")
  paths = report.save(out, out_dir, report.stem("sol"))
  print(f"saved {', '.join(paths)}")
  return 0


if __name__ == "__main__":
  _cli.run(main)
