"""Whether XLA runs the jax_llar custom call inside a CUDA graph.

`check` runs a jitted chain of jax_llar psums (or of copy calls) in a child
process (`jax_llar.tools.programs.graph_child`; XLA flags apply from backend
start) with XLA's dump on, and looks for evidence in two places:

1. XLA's dump (``--xla_dump_to``): the thunk sequence XLA emits for the
   program. Command buffers are formed on the thunk sequence, not in the HLO
   text, so the check reads the dump files that mention our target and the
   lines above each mention (`scan_dump`).
2. A profiler trace, read with `jax_llar.tools.traces`: events of command
   buffers, CUDA graph launches and our kernels. The call counts as captured
   when our kernel ran many times while the host issued (almost) no kernel
   launches of its own, between command-buffer executions that launched
   CUDA graphs (`scan_trace`).
"""

from __future__ import annotations

import collections
import glob
import json
import os
import re
import subprocess
import sys
from typing import Sequence

from jax_llar.tools import traces

TARGET = "jax_llar_all_reduce"
CHILD = "jax_llar.tools.programs.graph_child"
# Event names that tell how the GPU work was launched.
_LAUNCH_EVENTS = re.compile(r"command|graph|llar|OneShot|Copy|LaunchKernel", re.I)
_COMMAND_BUFFER = re.compile(r"command.?buffer|CommandBuffer", re.I)


def scan_dump(dump_dir: str) -> dict:
  """Reads XLA's dump: which files mention TARGET and, in thunk files, the
  command-buffer lines within 40 lines above each mention.

  Returns:
    ``{"files_mentioning_target", "evidence" (at most 6: file, line,
    command_buffer_lines_above), "in_command_buffer"}``.
  """
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
        cmd = [w for w in window if _COMMAND_BUFFER.search(w)]
        evidence.append({"file": name, "line": line.strip()[:300],
                         "command_buffer_lines_above": [c.strip()[:300] for c in cmd[-3:]]})
        if cmd:
          in_cmd_buffer = True
        if len(evidence) >= 6:
          break
  return {"files_mentioning_target": mentioning[:20], "evidence": evidence,
          "in_command_buffer": in_cmd_buffer}


def scan_events(events: Sequence[traces.Event]) -> dict:
  """The trace evidence of capture, from a neutral event list.

  Returns:
    ``{"our_kernel_runs", "host_kernel_launches" (events named
    ``*LaunchKernel*``), "graph_launches" (``*GraphLaunch*``),
    "command_buffer_events" (names containing ``command_buffer``),
    "captured", "matching_event_names" (the 40 most frequent names that
    mention launches, graphs or our kernels), "timeline"
    (`traces.timeline`)}``.
  """
  counts = collections.Counter(e.name for e in events if _LAUNCH_EVENTS.search(e.name))
  mine = [e for e in events if traces.ours(e)]
  host_launches = sum(v for k, v in counts.items() if "LaunchKernel" in k)
  graph_launches = sum(v for k, v in counts.items() if "GraphLaunch" in k)
  cmd_exec = sum(v for k, v in counts.items() if "command_buffer" in k.lower())
  # Our kernel ran n times but the host launched (almost) no kernels itself:
  # the launches came from CUDA graphs that XLA's command buffers launched.
  captured = (bool(mine) and graph_launches > 0 and cmd_exec > 0 and
              host_launches < len(mine) / 4)
  return {"our_kernel_runs": len(mine), "host_kernel_launches": host_launches,
          "graph_launches": graph_launches, "command_buffer_events": cmd_exec,
          "captured": captured,
          "kernel_processes": sorted({e.process for e in mine}),
          "matching_event_names": dict(counts.most_common(40)),
          "timeline": traces.timeline(events)}


def scan_trace(trace_dir: str) -> dict:
  """`scan_events` of the trace under `trace_dir`, with ``trace_found`` and
  ``trace`` (the file); ``{"trace_found": False}`` when there is none."""
  path = traces.find_xplane(trace_dir)
  if path is None:
    return {"trace_found": False}
  return {"trace_found": True, "trace": path, **scan_events(traces.read(trace_dir))}


def _last_json_line(text: str) -> dict | None:
  for line in reversed(text.strip().splitlines()):
    line = line.strip()
    if line.startswith("{"):
      try:
        return json.loads(line)
      except json.JSONDecodeError:
        return None
  return None


def check(out_dir: str, xla_flags: Sequence[str] = (), impl: str = "llar",
          timeout_s: int = 600) -> dict:
  """Runs the chain of `impl` (``"llar"`` or ``"copy"``) in a child process
  whose ``XLA_FLAGS`` are `xla_flags` plus ``--xla_dump_to`` (this process's
  ``XLA_FLAGS`` are not passed on) and returns the verdict.

  Args:
    out_dir: folder for ``xla_dump_<impl>/`` and ``trace_<impl>/``
      (created).
    xla_flags: extra XLA flags for the child, each one flag.
    impl: ``"llar"`` or ``"copy"``.
    timeout_s: seconds allowed for the child.

  Returns:
    ``{"xla_flags", "child_rc", "child" (its JSON line, or None),
    "child_stderr" (tail), "dump" (`scan_dump`), "trace" (`scan_trace`),
    "in_command_buffer"}``; the last is True when the dump or the trace
    shows the call inside a command buffer, False when the child failed.

  Raises:
    subprocess.TimeoutExpired: when the child runs past `timeout_s`.
  """
  os.makedirs(out_dir, exist_ok=True)
  dump_dir = os.path.join(out_dir, f"xla_dump_{impl}")
  trace_dir = os.path.join(out_dir, f"trace_{impl}")
  env = dict(os.environ)
  env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  env["XLA_FLAGS"] = " ".join(
      f for f in (*xla_flags, f"--xla_dump_to={dump_dir}") if f)
  proc = subprocess.run([sys.executable, "-m", CHILD, trace_dir, impl], env=env,
                        capture_output=True, text=True, timeout=timeout_s)
  verdict = {"xla_flags": env["XLA_FLAGS"], "child_rc": proc.returncode,
             "child": _last_json_line(proc.stdout),
             "child_stderr": proc.stderr[-3000:]}
  if proc.returncode == 0:
    verdict["dump"] = scan_dump(dump_dir)
    try:
      verdict["trace"] = scan_trace(trace_dir)
    except Exception as e:  # noqa: BLE001 - the dump is the primary evidence
      verdict["trace"] = {"trace_found": False, "error": f"{type(e).__name__}: {e}"}
    verdict["in_command_buffer"] = (verdict["dump"]["in_command_buffer"] or
                                    bool(verdict["trace"].get("captured")))
  else:
    verdict["in_command_buffer"] = False
  return verdict
