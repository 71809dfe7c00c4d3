"""Shows whether XLA runs the jax_llar custom call inside a CUDA graph.

``python -m jax_llar.graphcheck [--out DIR] [--xla-flags FLAGS]`` compiles and
runs a jitted shard_map chain of jax_llar psums and multiplies, then looks for
evidence in two places:

1. XLA's dump (``--xla_dump_to``): the thunk sequence XLA emits for the
   program. Command buffers are formed on the thunk sequence, not in the HLO
   text (MEASURED.md). Reported: the dump files that mention our target, and
   the lines around it.
2. A profiler trace (``jax.profiler.trace`` with a Perfetto trace): event
   names mentioning command buffers, CUDA graph launches and our kernels. The
   call counts as captured when our kernel ran many times while the host
   issued (almost) no kernel launches of its own, between command-buffer
   executions that launched CUDA graphs.

Prints a JSON verdict; exit status 0 when the custom call is inside a command
buffer according to the dump, 1 otherwise. The check runs in a subprocess so
that XLA flags apply from backend start.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import subprocess
import sys
import tempfile

TARGET = "jax_llar_all_reduce"

_CHILD = r"""
import os, sys, json
import jax, jax.numpy as jnp, numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import jax_llar
mesh = Mesh(np.array(jax.devices()), ("x",))
from jax_llar import _copy
op = _copy.copy if sys.argv[2] == "copy" else (lambda v: jax_llar.psum(v, "x"))
def body(x):
  f = (lax.axis_index("x") + 1).astype(x.dtype)
  for _ in range(64):
    x = op(x) * f * 0.25
  return x
fn = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                           check_vma=False))
x = jax.device_put(jnp.ones(1024 * mesh.size, jnp.float32), NamedSharding(mesh, P("x")))
for _ in range(3):
  fn(x).block_until_ready()
trace_dir = sys.argv[1]
try:
  with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
    for _ in range(5):
      fn(x).block_until_ready()
  trace_error = None
except Exception as e:  # the dump is the primary evidence; report and go on
  trace_error = f"{type(e).__name__}: {e}"
print(json.dumps({"decisions": [d.impl for d in jax_llar.dispatch_log()],
                  "trace_error": trace_error}))
"""


def _scan_dump(dump_dir: str) -> dict:
  files = sorted(glob.glob(os.path.join(dump_dir, "**", "*"), recursive=True))
  mentioning, evidence, in_cmd_buffer = [], [], False
  for path in files:
    if not os.path.isfile(path) or os.path.getsize(path) > 50_000_000:
      continue
    try:
      with open(path, errors="replace") as f:
        text = f.read()
    except OSError:
      continue
    if TARGET not in text:
      continue
    name = os.path.basename(path)
    mentioning.append(name)
    if "thunk" not in name.lower():
      continue
    lines = text.splitlines()
    for i, line in enumerate(lines):
      if TARGET in line:
        window = lines[max(0, i - 40): i + 3]
        cmd = [w for w in window if re.search(r"command.?buffer|CommandBuffer", w, re.I)]
        evidence.append({"file": name, "line": line.strip()[:300],
                         "command_buffer_lines_above": [c.strip()[:300] for c in cmd[-3:]]})
        if cmd:
          in_cmd_buffer = True
        if len(evidence) >= 6:
          break
  return {"files_mentioning_target": mentioning[:20], "evidence": evidence,
          "in_command_buffer": in_cmd_buffer}


def _scan_trace(trace_dir: str) -> dict:
  paths = glob.glob(os.path.join(trace_dir, "**", "*perfetto_trace.json.gz"), recursive=True)
  if not paths:
    return {"trace_found": False}
  with gzip.open(paths[0], "rt") as f:
    data = json.load(f)
  events = data.get("traceEvents", data if isinstance(data, list) else [])
  pat = re.compile(r"command|graph|llar|OneShot|Copy|LaunchKernel", re.I)
  counts = collections.Counter(e.get("name", "") for e in events
                               if isinstance(e, dict) and pat.search(e.get("name", "")))
  ours = [e for e in events if isinstance(e, dict) and
          re.search(r"OneShotLLKernel|CopyKernel", e.get("name", ""))]
  host_launches = sum(v for k, v in counts.items() if "LaunchKernel" in k)
  graph_launches = sum(v for k, v in counts.items() if "GraphLaunch" in k)
  cmd_exec = sum(v for k, v in counts.items() if "command_buffer" in k.lower())
  # Our kernel ran n times but the host launched (almost) no kernels itself:
  # the launches came from CUDA graphs that XLA's command buffers launched.
  captured = bool(ours) and graph_launches > 0 and cmd_exec > 0 and host_launches < len(ours) / 4
  return {"trace_found": True, "trace": paths[0],
          "our_kernel_runs": len(ours), "host_kernel_launches": host_launches,
          "graph_launches": graph_launches, "command_buffer_events": cmd_exec,
          "kernel_event_args": ours[0].get("args") if ours else None,
          "captured": captured,
          "matching_event_names": dict(counts.most_common(40)),
          "timeline": timeline(events)}


def timeline(events) -> dict:
  """Per device: median duration of our kernel and of the other kernels that
  run between two of ours, and the median period between our kernels' starts
  (device timestamps, microseconds; the profiler inflates short kernels)."""
  import statistics
  ours = re.compile(r"OneShotLLKernel|CopyKernel")
  by_pid = collections.defaultdict(list)
  for e in events:
    if isinstance(e, dict) and e.get("ph") == "X" and "dur" in e:
      by_pid[e.get("pid")].append(e)
  out = {}
  for pid, evs in by_pid.items():
    mine = sorted((e for e in evs if ours.search(e.get("name", ""))), key=lambda e: e["ts"])
    if len(mine) < 4:
      continue
    starts = [e["ts"] for e in mine]
    periods = [b - a for a, b in zip(starts, starts[1:]) if b - a < 50]
    others = [e for e in evs if not ours.search(e.get("name", "")) and
              mine[0]["ts"] <= e["ts"] <= mine[-1]["ts"] and e.get("tid") == mine[0].get("tid")]
    out[str(pid)] = {
        "n": len(mine), "kernel": mine[0]["name"][:80],
        "our_kernel_us": statistics.median(e["dur"] for e in mine),
        "other_kernels_us": statistics.median(e["dur"] for e in others) if others else None,
        "other_names": sorted({e["name"][:60] for e in others})[:5],
        "period_us": statistics.median(periods) if periods else None,
    }
  return out


def _pid_names(events) -> dict:
  names = {}
  for e in events:
    if isinstance(e, dict) and e.get("ph") == "M" and e.get("name") == "process_name":
      names[e.get("pid")] = str(e.get("args", {}).get("name", ""))
  return names


def trace_stats(events, calls: int) -> dict:
  """Where the time of `calls` profiled executions of one jitted chain goes.

  Device side, per GPU (profiler timestamps, microseconds): our kernels are
  split into exactly `calls` executions at the `calls - 1` longest pauses
  between one of them ending and the next starting (`executions_found` says
  when there were too few kernels); an execution runs from its first kernel
  of ours to its last.
  Within an execution: the median and the mean period between the starts of
  our kernels from the second on; the median duration of the execution's
  first kernel of ours (in an all-reduce chain the GPU that starts first
  waits there for the other); and the idle time between consecutive
  kernels, split into gaps up to 5 us and stalls over 5 us (the GPU waiting
  for work). The mean period includes
  stalls, the median does not.
  Host side: duration of every cuGraphLaunch, how far apart the GPUs'
  executions start (profiler timestamps share one clock), and the host
  events (by name) that took the most time in total.
  """
  import statistics
  ours = re.compile(r"OneShotLLKernel|CopyKernel")
  names = _pid_names(events)
  xs = [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and "dur" in e]
  by_pid = collections.defaultdict(list)
  for e in xs:
    by_pid[e.get("pid")].append(e)
  devices, first_starts = {}, {}
  for pid, evs in by_pid.items():
    mine_all = [e for e in evs if ours.search(e.get("name", ""))]
    if len(mine_all) < 4:
      continue
    tid = mine_all[0].get("tid")
    stream = sorted((e for e in evs if e.get("tid") == tid), key=lambda e: e["ts"])
    mine_all = sorted(mine_all, key=lambda e: e["ts"])
    # Executions: cut between consecutive kernels of ours at the calls - 1
    # longest pauses (end of one to start of the next).
    pauses = [(b["ts"] - (a["ts"] + a["dur"]), i + 1)
              for i, (a, b) in enumerate(zip(mine_all, mine_all[1:]))]
    cuts = sorted(i for _, i in sorted(pauses, reverse=True)[:max(0, calls - 1)])
    bounds = [0] + cuts + [len(mine_all)]
    periods, firsts, first_kernel, gaps_small, stalls = [], [], [], 0.0, []
    for lo, hi in zip(bounds, bounds[1:]):
      mine = mine_all[lo:hi]
      if not mine:
        continue
      t_lo, t_hi = mine[0]["ts"], mine[-1]["ts"]
      seg = [e for e in stream if t_lo <= e["ts"] <= t_hi]
      firsts.append(mine[0]["ts"])
      first_kernel.append(mine[0]["dur"])
      # From the second kernel on: the first one's wait is reported apart.
      periods += [b["ts"] - a["ts"] for a, b in zip(mine[1:], mine[2:])]
      for a, b in zip(seg, seg[1:]):
        gap = b["ts"] - (a["ts"] + a["dur"])
        if gap > 5:
          stalls.append(gap)
        elif gap > 0:
          gaps_small += gap
    n_steps = max(1, len(periods))
    name = names.get(pid, str(pid))
    devices[name] = {
        "our_kernels": len(mine_all), "executions_found": len(firsts),
        "kernel_us_median": statistics.median(e["dur"] for e in mine_all),
        "first_kernel_us_median": statistics.median(first_kernel) if first_kernel else None,
        "period_us_median": statistics.median(periods) if periods else None,
        "period_us_mean": (sum(periods) / len(periods)) if periods else None,
        "gap_us_per_step_small": gaps_small / n_steps,
        "stalls_over_5us": len(stalls),
        "stall_us_per_step": sum(stalls) / n_steps,
        "stall_us_max": max(stalls) if stalls else 0.0,
    }
    first_starts[name] = firsts
  skews = []
  if len(first_starts) >= 2 and all(len(v) == calls for v in first_starts.values()):
    lists = list(first_starts.values())
    for i in range(calls):
      col = [v[i] for v in lists]
      skews.append(max(col) - min(col))
  launches = [e["dur"] for e in xs if "GraphLaunch" in e.get("name", "")]
  totals = collections.Counter()
  counts = collections.Counter()
  device_pids = {pid for pid, evs in by_pid.items()
                 if names.get(pid, "").startswith("/device") or
                 sum(1 for e in evs if ours.search(e.get("name", ""))) >= 4}
  for e in xs:
    if e.get("pid") in device_pids:
      continue
    key = re.sub(r"[0-9]+", "#", e.get("name", ""))[:60]
    totals[key] += e["dur"]
    counts[key] += 1
  return {
      "calls": calls, "devices": devices,
      "graph_launch_us": sorted(launches),
      "start_skew_us": skews,
      "host_top": [{"name": k, "count": counts[k], "total_us": round(v, 1)}
                   for k, v in totals.most_common(12)],
  }


def check(out_dir: str, xla_flags: str = "", impl: str = "llar") -> dict:
  """Runs the chain with `impl` ("llar" or "copy") in a child process and
  returns the verdict dict (see the module docstring)."""
  os.makedirs(out_dir, exist_ok=True)
  dump_dir = os.path.join(out_dir, f"xla_dump_{impl}")
  trace_dir = os.path.join(out_dir, f"trace_{impl}")
  env = dict(os.environ)
  env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  env["XLA_FLAGS"] = " ".join(
      f for f in (xla_flags, f"--xla_dump_to={dump_dir}") if f)
  proc = subprocess.run([sys.executable, "-c", _CHILD, trace_dir, impl], env=env,
                        capture_output=True, text=True, timeout=600)
  verdict = {"xla_flags": env["XLA_FLAGS"], "child_rc": proc.returncode,
             "child_stdout": proc.stdout[-2000:], "child_stderr": proc.stderr[-3000:]}
  if proc.returncode == 0:
    verdict["dump"] = _scan_dump(dump_dir)
    verdict["trace"] = _scan_trace(trace_dir)
    verdict["in_command_buffer"] = (verdict["dump"]["in_command_buffer"] or
                                    bool(verdict["trace"].get("captured")))
  else:
    verdict["in_command_buffer"] = False
  return verdict


def git_commit() -> str | None:
  """The checkout's HEAD commit (for result files), or None outside git."""
  try:
    return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.abspath(__file__)),
                          timeout=10).stdout.strip() or None
  except (OSError, subprocess.SubprocessError):
    return None


def main(argv=None) -> int:
  p = argparse.ArgumentParser(
      description=__doc__.splitlines()[0] + " Needs 2+ CUDA GPUs; exit status 0 "
      "when the custom call was captured into a command buffer, 1 otherwise.")
  p.add_argument("--out", default=None,
                 help="folder for the XLA dump and profiler traces (default: a new "
                      "temporary folder)")
  p.add_argument("--xla-flags", default="",
                 help="extra XLA_FLAGS for the child process, e.g. "
                      "--xla_gpu_enable_command_buffer=")
  p.add_argument("--timeline-copy", action="store_true",
                 help="also profile the same chain with the trivial copy call")
  args = p.parse_args(argv)
  args.out = args.out or tempfile.mkdtemp(prefix="llar_graphcheck_")
  verdict = check(args.out, args.xla_flags)
  if args.timeline_copy:
    copy = check(args.out, args.xla_flags, impl="copy")
    verdict["copy_timeline"] = copy.get("trace", {}).get("timeline")
  verdict["git_commit"] = os.environ.get("LLAR_GIT_COMMIT") or git_commit()
  print(json.dumps(verdict, indent=1))
  return 0 if verdict["in_command_buffer"] else 1


if __name__ == "__main__":
  sys.exit(main())
