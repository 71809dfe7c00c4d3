"""Whether XLA runs the jax_llar custom call inside a CUDA graph.

`check` runs a jitted chain of jax_llar psums (or of copy calls) in a child
process (`jax_llar.tools.programs.graph_child`; XLA flags apply from backend
start) with XLA's dump on, and looks for evidence in two places:

1. XLA's dump (``--xla_dump_to``), read by `scan_dump`. Where XLA forms
   command buffers decides where they show:

   - On thunks (XLA of jax 0.11 and later: ``CommandBufferConversionPass``
     in ``GpuExecutable``'s thunk passes). ``module_N.<name>.thunk_sequence.txt``
     holds the thunks as emitted and, when the passes changed them,
     ``module_N.<name>.thunk_sequence_after_thunk_passes.txt`` the result:
     one line per thunk, ``<indent><thunk id>: <kind>`` (``SequentialThunk::
     ToString``), the thunks of a command buffer indented under their
     ``kCommandBuffer`` line. These lines name no custom-call target, so
     ``module_N.<name>.thunk_metadata.txt`` (a text ``ThunkMetadataListProto``:
     thunk id, kind, and the HLO instruction's name as
     ``profile_annotation``) ties a thunk id to an instruction, and the
     optimized HLO (``module_N.<name>.<platform>_after_optimizations.txt``)
     ties the instruction to its ``custom_call_target``.
   - In HLO (older XLA: the ``CommandBufferScheduling`` pass). The optimized
     HLO holds computations named ``command_buffer...`` that a ``call``
     instruction runs (``to_apply=%command_buffer``); the custom call is
     captured when it sits in such a computation.

2. A profiler trace, read with `jax_llar.tools.traces`: events of command
   buffers, CUDA graph launches and our kernels. The call counts as captured
   when our kernel ran many times while the host issued (almost) no kernel
   launches of its own, between command-buffer executions that launched
   CUDA graphs (`scan_trace`).

The verdict rests on the dump when the dump decides, and on the trace
otherwise; it says which (``"evidence"``).
"""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
from typing import Sequence

from jax_llar.tools import traces

TARGET = "jax_llar_all_reduce"
# The custom-call target of each implementation the child can run (the copy
# call's is jax_llar.tools.copy.TARGET_COPY).
TARGETS = {"llar": TARGET, "copy": "jax_llar_copy",
           "loopback": "jax_llar_loopback_all_reduce"}
CHILD = "jax_llar.tools.programs.graph_child"
# Event names that tell how the GPU work was launched.
_LAUNCH_EVENTS = re.compile(r"command|graph|llar|OneShot|Copy|LaunchKernel", re.I)

# XLA's dump files, by what follows ``module_NNNN.<module name>.``.
_MODULE = re.compile(r"^(module_\d+)\.")
_AFTER_PASSES = "thunk_sequence_after_thunk_passes.txt"
_THUNKS = "thunk_sequence.txt"
_METADATA = "thunk_metadata.txt"
_HLO_AFTER = "after_optimizations.txt"  # e.g. sm_9.0a_gpu_after_optimizations.txt
_MAX_FILE_BYTES = 200_000_000

# HLO text: a computation header, an instruction, a call of a computation.
_HLO_COMPUTATION = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_HLO_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_HLO_TO_APPLY = re.compile(r"\bto_apply=%?([\w.\-]+)")
# Thunk sequence text: "<indent>NNN: kKind ..." (NNN the thunk id), or
# "<indent>kKind\t..." as older XLA prints it.
_THUNK_LINE = re.compile(r"^(\s*)(?:(\d+):\s+)?(k[A-Z]\w*)\b(.*)$")
_META_ENTRY = re.compile(r"thunk_metadata\s*\{")
_META_ID = re.compile(r"\bthunk_id:\s*(\d+)")
_META_ANNOTATION = re.compile(r'\bprofile_annotation:\s*"((?:[^"\\]|\\.)*)"')
_META_KIND = re.compile(r'\bthunk_kind:\s*"(\w+)"')


def _read(path: str) -> str | None:
  try:
    if os.path.getsize(path) > _MAX_FILE_BYTES:
      return None
    with open(path, errors="replace") as f:
      return f.read()
  except OSError:
    return None


def parse_hlo(text: str, target: str) -> dict:
  """The custom calls of `target` in an HLO module's text, and the
  command-buffer computations.

  Returns:
    ``{"calls": {instruction name: computation name}, "command_buffers":
    [names of computations called with to_apply= whose name starts with
    "command_buffer"], "entry": entry computation name or None}``.
  """
  calls, applied, computations = {}, set(), []
  entry, current = None, None
  needle = f'custom_call_target="{target}"'
  for line in text.splitlines():
    header = _HLO_COMPUTATION.match(line)
    if header:
      current = header.group(2)
      computations.append(current)
      if header.group(1):
        entry = current
      continue
    if line.startswith("}"):
      current = None
      continue
    inst = _HLO_INSTRUCTION.match(line)
    if current is None or not inst:
      continue
    rest = inst.group(2)
    if needle in rest and "custom-call(" in rest:
      calls[inst.group(1)] = current
    applied.update(_HLO_TO_APPLY.findall(rest))
  command_buffers = [c for c in computations
                     if c.startswith("command_buffer") and c in applied]
  return {"calls": calls, "command_buffers": command_buffers, "entry": entry}


def parse_thunk_metadata(text: str) -> dict[int, tuple[str, str]]:
  """thunk id -> (kind, profile annotation) from a text
  ``ThunkMetadataListProto`` (``thunk_metadata.txt``)."""
  out = {}
  for chunk in _META_ENTRY.split(text)[1:]:
    tid, kind = _META_ID.search(chunk), _META_KIND.search(chunk)
    ann = _META_ANNOTATION.search(chunk)
    if tid:
      out[int(tid.group(1))] = (kind.group(1) if kind else "",
                                ann.group(1) if ann else "")
  return out


def parse_thunk_sequence(text: str) -> list[dict]:
  """The thunks of a thunk sequence dump, in order: ``{"id" (int or None),
  "kind", "text" (the rest of the line), "line", "in_command_buffer"
  (whether a kCommandBuffer line encloses it by indentation)}``."""
  out, stack = [], []  # stack: (indent, kind) of the enclosing lines
  for number, line in enumerate(text.splitlines(), 1):
    m = _THUNK_LINE.match(line)
    if not m:
      continue
    indent = len(m.group(1).expandtabs())
    while stack and stack[-1][0] >= indent:
      stack.pop()
    out.append({"id": int(m.group(2)) if m.group(2) else None,
                "kind": m.group(3), "text": m.group(4).strip(), "line": number,
                "in_command_buffer": any(k == "kCommandBuffer" for _, k in stack)})
    stack.append((indent, m.group(3)))
  return out


def _module_files(dump_dir: str) -> dict[str, dict[str, str]]:
  """module id (``module_NNNN``) -> {kind of file: path} for the files the
  scan reads; kinds: "after_passes", "thunks", "metadata", "hlo"."""
  modules: dict[str, dict[str, str]] = collections.defaultdict(dict)
  for root, _, names in os.walk(dump_dir):
    for name in sorted(names):
      m = _MODULE.match(name)
      if not m:
        continue
      kind = ("after_passes" if name.endswith(_AFTER_PASSES) else
              "thunks" if name.endswith("." + _THUNKS) else
              "metadata" if name.endswith(_METADATA) else
              "hlo" if name.endswith(_HLO_AFTER) else None)
      if kind:
        modules[m.group(1)].setdefault(kind, os.path.join(root, name))
  return dict(modules)


def _scan_module(files: dict[str, str], target: str) -> dict | None:
  """The dump evidence of one module, or None when its HLO has no call of
  `target`."""
  hlo_text = _read(files["hlo"]) if "hlo" in files else None
  if not hlo_text:
    return None
  hlo = parse_hlo(hlo_text, target)
  if not hlo["calls"]:
    return None
  result = {"hlo_file": os.path.basename(files["hlo"]),
            "custom_calls": sorted(hlo["calls"]),
            "hlo_command_buffers": hlo["command_buffers"]}
  # (a) Command buffers in HLO: each call sits in a called command_buffer
  # computation.
  in_hlo = sorted(n for n, c in hlo["calls"].items() if c in hlo["command_buffers"])
  if in_hlo:
    result.update(decided=True, in_command_buffer=len(in_hlo) == len(hlo["calls"]),
                  source="hlo command_buffer computation",
                  calls_in_command_buffer=in_hlo)
    return result
  # (b) Command buffers on thunks.
  seq_path = files.get("after_passes") or files.get("thunks")
  seq_text = _read(seq_path) if seq_path else None
  if not seq_text:
    result.update(decided=False, in_command_buffer=False,
                  source="no thunk sequence dump")
    return result
  thunks = parse_thunk_sequence(seq_text)
  result["thunk_file"] = os.path.basename(seq_path)
  result["command_buffer_thunks"] = sum(t["kind"] == "kCommandBuffer" for t in thunks)
  meta_text = _read(files["metadata"]) if "metadata" in files else None
  meta = parse_thunk_metadata(meta_text) if meta_text else {}
  names = set(hlo["calls"])
  # Which thunks are the calls: by thunk id through the metadata; else by the
  # instruction name on the thunk's line (older XLA prints it there); else
  # every custom-call thunk of the module (the graph child's only custom
  # calls are the target's).
  ours_by_id = {tid for tid, (_, ann) in meta.items() if ann in names}
  ours = [t for t in thunks if t["id"] is not None and t["id"] in ours_by_id]
  source = "thunk sequence + thunk metadata"
  if not ours:
    ours = [t for t in thunks if t["kind"] == "kCustomCall" and (
        target in t["text"] or any(re.search(rf"(?<![\w.\-]){re.escape(n)}(?![\w.\-])",
                                             t["text"]) for n in names))]
    source = "thunk sequence (instruction names on the thunk lines)"
  if not ours:
    ours = [t for t in thunks if t["kind"] == "kCustomCall"]
    source = "thunk sequence (every kCustomCall thunk of the module)"
  if not ours:
    result.update(decided=False, in_command_buffer=False,
                  source="no thunk of the call found")
    return result
  inside = [t for t in ours if t["in_command_buffer"]]
  result.update(decided=True, in_command_buffer=len(inside) == len(ours),
                source=source, thunks_of_the_call=len(ours),
                thunks_in_command_buffer=len(inside),
                example_lines=[f'{t["line"]}: {t["kind"]} {t["text"]}'.strip()[:200]
                               for t in (inside or ours)[:3]])
  return result


def scan_dump(dump_dir: str, target: str = TARGET) -> dict:
  """Reads XLA's dump (see the module docstring): is every call of
  `target` inside a command buffer?

  Args:
    dump_dir: the ``--xla_dump_to`` folder.
    target: the custom-call target.

  Returns:
    ``{"files_mentioning_target" (at most 20 names), "modules" (per module
    whose optimized HLO calls `target`: its evidence, with "decided",
    "in_command_buffer" and "source"), "decided" (some module's dump
    decides), "in_command_buffer" (every deciding module has all its calls
    inside command buffers), "source" (what decided, or why nothing did)}``.
  """
  mentioning = []
  for root, _, names in os.walk(dump_dir):
    for name in sorted(names):
      text = _read(os.path.join(root, name))
      if text and target in text:
        mentioning.append(name)
  modules = {}
  for module, files in sorted(_module_files(dump_dir).items()):
    found = _scan_module(files, target)
    if found is not None:
      modules[module] = found
  deciding = {m: r for m, r in modules.items() if r["decided"]}
  if deciding:
    sources = sorted({r["source"] for r in deciding.values()})
    verdict = all(r["in_command_buffer"] for r in deciding.values())
    source = "; ".join(sources)
  else:
    verdict = False
    source = ("no optimized HLO calls the target" if not modules else
              "; ".join(sorted({r["source"] for r in modules.values()})))
  return {"files_mentioning_target": sorted(mentioning)[:20], "modules": modules,
          "decided": bool(deciding), "in_command_buffer": verdict,
          "source": source}


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
  """Runs the chain of `impl` (``"llar"``, ``"copy"`` or ``"loopback"``: a
  loopback group of 2 simulated ranks on one GPU) in a child process
  whose ``XLA_FLAGS`` are `xla_flags` plus ``--xla_dump_to`` (this process's
  ``XLA_FLAGS`` are not passed on) and returns the verdict.

  Args:
    out_dir: folder for ``xla_dump_<impl>/`` and ``trace_<impl>/``
      (created).
    xla_flags: extra XLA flags for the child, each one flag.
    impl: ``"llar"``, ``"copy"`` or ``"loopback"``.
    timeout_s: seconds allowed for the child.

  Returns:
    ``{"xla_flags", "child_rc", "child" (its JSON line, or None),
    "child_stderr" (tail), "dump" (`scan_dump`), "trace" (`scan_trace`),
    "in_command_buffer", "evidence", "evidence_agree"}`` (the last three
    from `decide`: the dump's verdict when it decides, else the trace's;
    False, with evidence "none", when the child failed).

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
    verdict["dump"] = scan_dump(dump_dir, TARGETS[impl])
    try:
      verdict["trace"] = scan_trace(trace_dir)
    except Exception as e:  # noqa: BLE001 - the dump is the primary evidence
      verdict["trace"] = {"trace_found": False, "error": f"{type(e).__name__}: {e}"}
    verdict.update(decide(verdict["dump"], verdict["trace"]))
  else:
    verdict.update(in_command_buffer=False, evidence="none (the child failed)",
                   evidence_agree=None)
  return verdict


def decide(dump: dict, trace: dict) -> dict:
  """The verdict from the two pieces of evidence: the dump when it decides
  (it is what XLA compiled), else the trace.

  Returns:
    ``{"in_command_buffer", "evidence" ("dump: <source>", "trace", or
    "none"), "evidence_agree" (True/False when both decide, else None)}``.
  """
  trace_decides = bool(trace.get("trace_found")) and "captured" in trace
  agree = None
  if dump.get("decided") and trace_decides:
    agree = bool(dump["in_command_buffer"]) == bool(trace["captured"])
  if dump.get("decided"):
    return {"in_command_buffer": bool(dump["in_command_buffer"]),
            "evidence": f"dump: {dump['source']}", "evidence_agree": agree}
  if trace_decides:
    return {"in_command_buffer": bool(trace["captured"]),
            "evidence": f"trace (the dump did not decide: {dump.get('source')})",
            "evidence_agree": agree}
  return {"in_command_buffer": False,
          "evidence": f"none (dump: {dump.get('source')}; no trace)",
          "evidence_agree": agree}
