"""Profiler traces as a neutral event list, and what the tools derive from them.

`read` opens the XSpace file that ``jax.profiler.trace(dir)`` writes
(``dir/plugins/profile/<run>/<host>.xplane.pb``) with the profiler's own
reader, ``jax.profiler.ProfileData.from_file``, and flattens it into
`Event` tuples: the plane name as the process (``/device:GPU:0``,
``/host:CPU``, ``/host:CUPTI``), the line name as the thread (a CUDA stream,
a host thread), the event name, and start and duration in microseconds on
the trace's single clock (the profiler converts device timestamps to it).
`trace_stats` and `timeline` read only that list, so synthetic events test
them.

Our kernels are the events whose name matches `KERNELS` (the name of the
one-shot kernel or of the copy kernel, mangled or not). A process is a
device when its name starts with ``/device:`` or when it holds at least
`MIN_KERNELS` of our kernels; within a device, our kernels' stream is the
thread that holds most of them.
"""

from __future__ import annotations

import collections
import glob
import os
import re
import shutil
import statistics
import tempfile
from typing import Any, Callable, Iterable, NamedTuple

# The names of our kernels, as a profiler reports them. The one place that
# knows them: every tool that looks for our kernels in a trace uses this.
# Every algorithm's kernel (ffi/src/kernels: OneShotLLKernel, TwoShotLLKernel,
# OneShotSentinelKernel, OneShotLL128Kernel, TwoShotLL128Kernel,
# TwoShotLL128AtomicKernel, NcclLLA2AOneShotKernel, OneShotLLAddRmsNormKernel)
# and the copy calls' (CopyKernel, WideCopyKernel).
KERNELS = re.compile(r"(?:OneShot|TwoShot|NcclLLA2AOneShot)\w*Kernel|CopyKernel")
DEVICE_PREFIX = "/device:"
MIN_KERNELS = 4
# Idle time between two kernels of one stream above this is a stall (the GPU
# waiting for work), at or below it a gap (microseconds).
STALL_US = 5.0


class Event(NamedTuple):
  """One timed event of a trace.

  Attributes:
    process: plane name, e.g. ``/device:GPU:0`` or ``/host:CPU``.
    thread: line name, e.g. a CUDA stream or a host thread.
    name: event name (for a kernel, its name as the profiler reports it).
    ts: start, microseconds on the trace's clock.
    dur: duration, microseconds (0 for instant events).
    stats: the event's statistics as (name, value) string pairs (XLA puts
      the HLO op, its module and the op's metadata name there); empty
      unless read with ``stats=True``.
  """
  process: str
  thread: str
  name: str
  ts: float
  dur: float
  stats: tuple[tuple[str, str], ...] = ()


def events_from_profile(data: Any, *, stats: bool = False) -> list[Event]:
  """Flattens a ``jax.profiler.ProfileData`` into `Event`s (planes, lines,
  events; nanoseconds become microseconds), with each event's statistics
  when `stats`."""
  out = []
  for plane in data.planes:
    for line in plane.lines:
      for e in line.events:
        st = (tuple((str(k), str(v)) for k, v in e.stats) if stats else ())
        out.append(Event(str(plane.name), str(line.name), str(e.name),
                         float(e.start_ns) / 1e3, float(e.duration_ns) / 1e3, st))
  return out


def find_xplane(trace_dir: str) -> str | None:
  """The newest ``*.xplane.pb`` under `trace_dir`, or None."""
  paths = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
  return max(paths, key=os.path.getmtime) if paths else None


def read(trace_dir: str, *, stats: bool = False) -> list[Event]:
  """Events of the trace that ``jax.profiler.trace(trace_dir)`` wrote (with
  their statistics when `stats`).

  Raises:
    FileNotFoundError: when `trace_dir` holds no ``.xplane.pb`` file.
  """
  from jax.profiler import ProfileData
  path = find_xplane(trace_dir)
  if path is None:
    raise FileNotFoundError(f"no .xplane.pb file under {trace_dir}")
  return events_from_profile(ProfileData.from_file(path), stats=stats)


def profile(fn: Callable[..., Any], *args: Any, calls: int = 3) -> list[Event]:
  """Runs ``fn(*args)`` `calls` times under ``jax.profiler.trace`` (waiting
  for each result) and returns the trace's events. The trace is written to a
  temporary folder, removed afterwards."""
  import jax
  d = tempfile.mkdtemp(prefix="llar_trace_")
  try:
    with jax.profiler.trace(d):
      for _ in range(calls):
        jax.block_until_ready(fn(*args))
    return read(d)
  finally:
    shutil.rmtree(d, ignore_errors=True)


def device_calls(events: Iterable[Event], gap_us: float = 1000.0) -> list[list[Event]]:
  """The device kernels of `events` (positive duration, on a ``/device:``
  process) in start order, cut into calls wherever no kernel runs for more
  than `gap_us` microseconds: one list per call. The caller pauses between
  its calls for longer than `gap_us` (and no call idles that long), so that
  each list is one call's kernels.

  Example (three calls of f in one trace, a pause after each)::

    def run():
      for _ in range(3):
        jax.block_until_ready(f(x))
        time.sleep(0.002)
    calls = device_calls(profile(run, calls=1))   # three lists of kernels
  """
  kernels = sorted((e for e in events if e.process.startswith(DEVICE_PREFIX) and e.dur > 0),
                   key=lambda e: e.ts)
  calls: list[list[Event]] = []
  end = None
  for e in kernels:
    if end is None or e.ts - end > gap_us:
      calls.append([])
      end = e.ts + e.dur
    calls[-1].append(e)
    end = max(end, e.ts + e.dur)
  return calls


def ours(e: Event) -> bool:
  """True for an event of one of our kernels."""
  return bool(KERNELS.search(e.name))


def _by_process(events: Iterable[Event]) -> dict[str, list[Event]]:
  by = collections.defaultdict(list)
  for e in events:
    by[e.process].append(e)
  return by


def _kernel_stream(evs: list[Event]) -> tuple[str, list[Event]] | None:
  """The thread holding most of our kernels in one process, and those
  kernels sorted by start; None below MIN_KERNELS."""
  counts = collections.Counter(e.thread for e in evs if ours(e))
  if not counts:
    return None
  thread, n = counts.most_common(1)[0]
  if n < MIN_KERNELS:
    return None
  return thread, sorted((e for e in evs if e.thread == thread and ours(e)),
                        key=lambda e: e.ts)


def device_processes(events: Iterable[Event]) -> set[str]:
  """Processes that are devices: named ``/device:...`` or holding at least
  MIN_KERNELS of our kernels."""
  out = set()
  for proc, evs in _by_process(events).items():
    if proc.startswith(DEVICE_PREFIX) or _kernel_stream(evs) is not None:
      out.add(proc)
  return out


def timeline(events: Iterable[Event]) -> dict[str, dict]:
  """Per device holding our kernels: the median duration of our kernels and
  of the other kernels on their stream between the first and last of ours,
  and the median period between our kernels' starts (periods under 50 us
  only), all in microseconds (the profiler lengthens short kernels).
  Keyed by process name."""
  out = {}
  for proc, evs in _by_process(events).items():
    found = _kernel_stream(evs)
    if found is None:
      continue
    thread, mine = found
    starts = [e.ts for e in mine]
    periods = [b - a for a, b in zip(starts, starts[1:]) if b - a < 50]
    others = [e for e in evs if e.thread == thread and not ours(e) and
              mine[0].ts <= e.ts <= mine[-1].ts]
    out[proc] = {
        "n": len(mine), "kernel": mine[0].name[:80],
        "our_kernel_us": statistics.median(e.dur for e in mine),
        "other_kernels_us": statistics.median(e.dur for e in others) if others else None,
        "other_names": sorted({e.name[:60] for e in others})[:5],
        "period_us": statistics.median(periods) if periods else None,
    }
  return out


def trace_stats(events: Iterable[Event], calls: int) -> dict:
  """Where the time of `calls` profiled executions of one jitted chain goes.

  Device side, per device holding our kernels (microseconds): our kernels
  are split into exactly `calls` executions at the `calls - 1` longest
  pauses between one of them ending and the next starting
  (``executions_found`` says when there were too few kernels); an execution
  runs from its first kernel of ours to its last. Within an execution: the
  median and the mean period between the starts of our kernels from the
  second on; the median duration of the execution's first kernel of ours (in
  an all-reduce chain the GPU that starts first waits there for the other);
  and the idle time between consecutive kernels of the stream, split into
  gaps up to STALL_US and stalls over it (the GPU waiting for work). The mean
  period includes stalls, the median does not.

  Host side: the duration of every CUDA graph launch (events named
  ``*GraphLaunch*``), how far apart the devices' executions start (one clock
  for all planes), and the host events (by name, digits folded) that took
  the most time in total.

  Args:
    events: the trace, as from `read` or `profile`.
    calls: how many executions the trace holds.

  Returns:
    dict with ``calls``, ``devices`` (process name -> statistics),
    ``graph_launch_us`` (sorted), ``start_skew_us`` (one per execution when
    every device found all `calls`), ``host_top`` (at most 12 entries).
  """
  events = list(events)
  by_proc = _by_process(events)
  devices, first_starts = {}, {}
  for proc, evs in by_proc.items():
    found = _kernel_stream(evs)
    if found is None:
      continue
    thread, mine_all = found
    stream = sorted((e for e in evs if e.thread == thread), key=lambda e: e.ts)
    # Executions: cut between consecutive kernels of ours at the calls - 1
    # longest pauses (end of one to start of the next).
    pauses = [(b.ts - (a.ts + a.dur), i + 1)
              for i, (a, b) in enumerate(zip(mine_all, mine_all[1:]))]
    cuts = sorted(i for _, i in sorted(pauses, reverse=True)[:max(0, calls - 1)])
    bounds = [0] + cuts + [len(mine_all)]
    periods, firsts, first_kernel, gaps_small, stalls = [], [], [], 0.0, []
    for lo, hi in zip(bounds, bounds[1:]):
      mine = mine_all[lo:hi]
      if not mine:
        continue
      t_lo, t_hi = mine[0].ts, mine[-1].ts
      seg = [e for e in stream if t_lo <= e.ts <= t_hi]
      firsts.append(mine[0].ts)
      first_kernel.append(mine[0].dur)
      # From the second kernel on: the first one's wait is reported apart.
      periods += [b.ts - a.ts for a, b in zip(mine[1:], mine[2:])]
      for a, b in zip(seg, seg[1:]):
        gap = b.ts - (a.ts + a.dur)
        if gap > STALL_US:
          stalls.append(gap)
        elif gap > 0:
          gaps_small += gap
    n_steps = max(1, len(periods))
    devices[proc] = {
        "our_kernels": len(mine_all), "executions_found": len(firsts),
        "stream": thread,
        "kernel_us_median": statistics.median(e.dur for e in mine_all),
        "first_kernel_us_median": statistics.median(first_kernel) if first_kernel else None,
        "period_us_median": statistics.median(periods) if periods else None,
        "period_us_mean": (sum(periods) / len(periods)) if periods else None,
        "gap_us_per_step_small": gaps_small / n_steps,
        "stalls_over_5us": len(stalls),
        "stall_us_per_step": sum(stalls) / n_steps,
        "stall_us_max": max(stalls) if stalls else 0.0,
    }
    first_starts[proc] = firsts
  skews = []
  if len(first_starts) >= 2 and all(len(v) == calls for v in first_starts.values()):
    lists = list(first_starts.values())
    for i in range(calls):
      col = [v[i] for v in lists]
      skews.append(max(col) - min(col))
  launches = [e.dur for e in events if "GraphLaunch" in e.name]
  dev = device_processes(events)
  totals, counts = collections.Counter(), collections.Counter()
  for e in events:
    if e.process in dev:
      continue
    key = re.sub(r"[0-9]+", "#", e.name)[:60]
    totals[key] += e.dur
    counts[key] += 1
  return {
      "calls": calls, "devices": devices,
      "graph_launch_us": sorted(launches),
      "start_skew_us": skews,
      "host_top": [{"name": k, "count": counts[k], "total_us": round(v, 1)}
                   for k, v in totals.most_common(12)],
  }
