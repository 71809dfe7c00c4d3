"""The sanitize tool's matrix, runs and verdicts (the command line is
``python -m jax_llar.tools.sanitize``).

Each unit of the matrix is one run of ``python -m jax_llar.tools.loopback``
(W simulated ranks on one GPU, the production launchers, every output
checked bitwise: ``jax_llar.tools.loopback``'s docstring) under one of the
four tools: memcheck (out-of-bounds and misaligned accesses, hardware
exceptions), racecheck (shared-memory hazards), synccheck (invalid uses of
barriers and warp-synchronous intrinsics) and initcheck (reads of
uninitialised global memory). The full matrix covers every algorithm the
harness simulates, at world sizes 2-16 where the ranks' grids fit on the
device, every dtype each serves, sizes at the edges of each grid rule (one
element, odd tails, one line and one block and one element either side,
where the grid grows, the largest served), the run-time world-size kernel
with misaligned buffers and unsynchronised ranks, the fused all-reduce +
add + RMSNorm over one-block and multi-block row clusters and both weight
dtypes, and the fault modes (a rank left out of a call; a call paired with
a call of another signature, whose foreign-signature report the other
signature fault ends in too). A fault unit is one fault child
(``jax_llar.tools.programs.loopback_fault``) under the sanitizer, run one at
a time after the clean units. `SMALL` is a cross-section of it for the
one-GPU test suite.

Verdict per (tool, unit), from the sanitizer's report (`parse_report`):
  clean unit: passes when the harness passed every case it ran and the
    sanitizer reported nothing (ERROR SUMMARY 0, no hazard, no error line);
  fault unit: the kernels trap on purpose (the bounded wait's report), so
    the sanitizer may report the trap (memcheck: "Trace/breakpoint trap",
    once per thread) and the CUDA calls that fail after it. It passes when
    the child's report is the one it must be (``loopback_harness.
    fault_problems``) and no sanitizer report is a defect (`DEFECT`: an invalid or misaligned
    access, a race, a barrier error, an uninitialised read, a leak); the
    reports it did make are counted as "expected", neither a pass nor a
    failure of the sanitizer.
Any other unit status fails it (the sanitizer's own failure, a unit that
did not finish within --unit_timeout_s, a run that never started).

A row (`run_unit`): ``{"tool", "unit", "fault", "status", "sanitizer_errors",
"defects", "expected", "reports", "loopback_rc", "cases", "seconds",
"command"}``, with "first_report" (the first report's lines, a defect's
first) when the sanitizer reported anything, "problem_cases" (the cases
that neither passed nor were skipped, and why) and "why" and the output's
"tail" when it failed.

What this shows and what not: what the sanitizer can see on one GPU, with
every store local; not NVLink, and not the FFI path through XLA.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Sequence

from jax_llar.tools.loopback import harness as lh


TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
# The order in which `run` starts the clean runs: racecheck's runs took the
# longest of a unit's four, then initcheck's (benchmarks/NOTES.md).
START_ORDER = {"racecheck": 0, "initcheck": 1, "memcheck": 2, "synccheck": 3}

NOTE = ("compute-sanitizer over the loopback harness: all ranks simulated on one GPU; "
        "what the sanitizer sees of the production kernels, not NVLink")

# Kernels run much slower under the sanitizer: the bound on every wait of a
# clean unit is long, so that no wait can time out by slowness alone.
CLEAN_TIMEOUT_MS = 60000
# A fault unit must wait out its timeout once per case (a rank left out).
FAULT_TIMEOUT_MS = 3000


@dataclasses.dataclass(frozen=True)
class Unit:
  """One sanitized run.

  Attributes:
    name: the unit's name in the matrix.
    args: a clean unit's ``python -m jax_llar.tools.loopback`` arguments.
    fault: a fault unit (traps expected): `spec` is the case its child runs.
    spec: the fault child's spec (``loopback_harness.fault_spec``); the child
      (``jax_llar.tools.programs.loopback_fault``) runs under the sanitizer
      itself, and its report is checked with ``loopback_harness.fault_problems``.
    tools: the tools this unit runs under (empty: every tool asked for).
    kernels: where not empty, only kernels whose names contain it are
      checked (``--kernel-name kns=...``): a unit that runs XLA checks
      jax_llar's kernels, not XLA's own.
  """
  name: str
  args: tuple[str, ...] = ()
  fault: bool = False
  spec: str = ""  # JSON, so that the unit stays hashable and printable
  tools: tuple[str, ...] = ()
  kernels: str = ""


def _all_reduce(name: str, algorithm: str, worlds: str, dtypes: str, sizes: str,
                *extra: str) -> Unit:
  return Unit(name, (f"--algorithm={algorithm}", f"--worlds={worlds}", f"--dtypes={dtypes}",
                     f"--sizes={sizes}", "--calls=3", "--sets=2",
                     f"--timeout_ms={CLEAN_TIMEOUT_MS}", *extra))


def _fault(name: str, algorithm: str, world: int, fault: str,
           tools: tuple[str, ...] = ()) -> Unit:
  """Rank 1 left out of call 1 of 3 (``skip``), or a signature fault of rank
  1 on call 1 (``extra_call``, ``swap_signature``); float32, 4 KiB."""
  timeout = FAULT_TIMEOUT_MS if fault == "skip" else CLEAN_TIMEOUT_MS
  settings = lh.Settings(worlds=(world,), dtypes=("float32",), sizes=(4096,), calls=3, sets=1,
                         timeout_ms=timeout, algorithm=algorithm)
  case = lh.Case(world, "float32", 4096, 0)
  if fault == "skip":
    spec = lh.fault_spec(settings, case, 1, 1)
  else:
    spec = lh.fault_spec(settings, case, -1, 0, fault=fault, fault_rank=1, fault_call=1)
  return Unit(name, fault=True, spec=json.dumps(spec, sort_keys=True), tools=tools)


ALL = "float32,bfloat16,float16,int32"

# The loopback group behind its FFI custom calls, inside XLA (loopback_xla):
# one-shot LL chains at 2 and 4 ranks, and the fused op at W = 2 and 4; only
# jax_llar's kernels (every name holds "Shot") are checked. What this unit
# adds to the harness's units is the FFI path's memory: XLA's operand and
# result buffers, read and written by the kernels (memcheck, initcheck) and
# the kernels' barriers as XLA launches them (synccheck). Not racecheck:
# shared-memory hazards are a kernel's own, the same kernels and shapes are
# racechecked through the harness (units above), and under racecheck the
# fused op at W = 4, 2 x 2048 launched this way ended in its bounded wait
# (benchmarks/NOTES.md).
XLA_UNIT = Unit("xla.loopback_group", ("--op=xla", "--algorithm=one_shot_ll", "--worlds=2,4",
                                       "--dtypes=float32,bfloat16", "--sizes=4,520,32776",
                                       "--shapes=1x64,2x2048", "--calls=3",
                                       f"--timeout_ms={CLEAN_TIMEOUT_MS}"),
                tools=("memcheck", "synccheck", "initcheck"), kernels="Shot")
# The fault units' tools: memcheck, which sees the trap and any access of
# the failure path (the error record's writes), and synccheck, the waits'
# warp-collective exits. The code a fault runs before its trap is a clean
# call's, which every tool checks in the clean units.
FAULT_TOOLS = ("memcheck", "synccheck")
FLOATS = "float32,bfloat16,float16"

# Sizes (bytes per rank) at the edges of each grid rule (kernels.h): one
# element of each width, an odd tail, and the first size past a line, a
# warp, a block, the rule's 64 blocks and (two-shots) one step per thread,
# beside a size just inside; and the largest served. The one-shot LL:
# 8-byte payload lines, 32 a warp, 64 a block until 64 blocks (32 KiB),
# then more a block, up to 512 (256 KiB). The sentinel: 16-byte lines, the
# same rule (64 KiB, 512 KiB). LL128: 120-byte lines, 4 a warp, 8 a block
# until 64 blocks (60 KiB), then up to 64 a block (480 KiB). The two-shots:
# a chunk per rank (fewer lines than ranks, unequal chunks), up to 64
# blocks, then several steps per thread (above 32768 LL or 4096 LL128 chunk
# lines: 524296 and 983044 bytes at 2 ranks), up to 4 MiB.
FULL = (
    _all_reduce("one_shot_ll", "one_shot_ll", "2,3,4,8,16", ALL,
                "2,4,6,8,16,100,260,512,520,32776,262144"),
    _all_reduce("one_shot_ll.generic.nosync.misaligned", "one_shot_ll", "2,4,8",
                "float32,bfloat16", "4,100,520,32776,262144", "--generic", "--no_sync",
                "--misalign=4"),
    _all_reduce("one_shot_sentinel", "one_shot_sentinel", "2,3,4,8,16", FLOATS,
                "2,4,6,18,516,1040,65552,524288"),
    _all_reduce("one_shot_sentinel.generic.nosync.misaligned8", "one_shot_sentinel", "2,3,8",
                "float16,float32", "20,4100,65536", "--generic", "--no_sync", "--misalign=8"),
    _all_reduce("one_shot_ll128", "one_shot_ll128", "2,3,4,8,16", ALL,
                "2,4,6,120,124,484,964,61444,491520"),
    _all_reduce("one_shot_ll128.nosync.misaligned", "one_shot_ll128", "2,3,8",
                "float32,bfloat16", "100,4200,65540", "--no_sync", "--misalign=3"),
    _all_reduce("two_shot_ll", "two_shot_ll", "2,3,4,8", ALL,
                "2,4,6,100,65540,524296,4194304"),
    _all_reduce("two_shot_ll.nosync.misaligned", "two_shot_ll", "2,3,5", "float32,bfloat16",
                "4,100,65540,1048580", "--no_sync", "--misalign=4"),
    _all_reduce("two_shot_ll128", "two_shot_ll128", "2,3,4,8", ALL,
                "2,4,6,124,65540,983044,4194304"),
    _all_reduce("two_shot_ll128_atomic", "two_shot_ll128_atomic", "2,3,4,8", ALL,
                "2,4,6,124,65540,1048580,4194304"),
    Unit("add_rms_norm", ("--op=add_rms_norm", "--worlds=2,3,4,8", f"--dtypes={FLOATS}",
                          "--shapes=1x64,2x64,32x64,1x640,1x2048,2x2048,8x2048,3x5120,"
                          "32x2048,1x16384", "--calls=3", f"--timeout_ms={CLEAN_TIMEOUT_MS}")),
    # The loopback group's FFI targets inside jitted programs (the fused op's too).
    XLA_UNIT,
    # Fault units run one at a time, after the clean ones (`run`).
    _fault("fault.skip.one_shot_ll", "one_shot_ll", 3, "skip", tools=FAULT_TOOLS),
    _fault("fault.extra_call.two_shot_ll", "two_shot_ll", 2, "extra_call", tools=FAULT_TOOLS),
)

# The one-GPU suite's cross-section: the fused kernel's one-block and
# multi-block rows with both weight dtypes (the class of the defect the
# sanitizer found), one one-shot and one two-shot with odd and line-edge
# sizes, and one fault under memcheck (which sees the trap; the fault units
# of FULL add synccheck). Its 12 clean runs start at once (SMALL_JOBS): a
# sanitized run's time is mostly its process's start, and one wave of them
# ends sooner than two.
SMALL = (
    Unit("add_rms_norm", ("--op=add_rms_norm", "--worlds=2", "--dtypes=bfloat16,float32",
                          "--shapes=1x64,2x2048", "--calls=2",
                          f"--timeout_ms={CLEAN_TIMEOUT_MS}")),
    _all_reduce("one_shot_ll", "one_shot_ll", "2,3", "float32,bfloat16", "6,520,32776"),
    _all_reduce("two_shot_ll128", "two_shot_ll128", "2", "float32", "4,124,65540"),
    _fault("fault.skip.one_shot_ll", "one_shot_ll", 2, "skip", tools=("memcheck",)),
)
SMALL_JOBS = sum(len(TOOLS) for u in SMALL if not u.fault)

MATRICES = {"full": FULL, "small": SMALL}

# --- the sanitizer's report ---------------------------------------------------------

PREFIX = "========="
# Report lines that are a defect in any unit (the sanitizer's wording for
# memcheck, racecheck, synccheck, initcheck and the leak check).
DEFECT = re.compile(r"Invalid __|[Mm]isaligned|out of bounds|[Oo]ut-of-range|"
                    r"Uninitialized|[Rr]ace reported|[Hh]azard|Barrier error|"
                    r"[Ii]nvalid (global|shared|local)|Leaked")
# Lines of the prefix that report nothing.
_NOT_REPORTS = re.compile(r"COMPUTE-SANITIZER|(ERROR|RACECHECK|LEAK) SUMMARY|"
                          r"Target application returned an error|This tool is")
_ERROR_SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) errors?")
_RACE_SUMMARY = re.compile(r"RACECHECK SUMMARY: \d+ hazards? displayed "
                           r"\((\d+) errors?, (\d+) warnings?\)")


def parse_report(text: str) -> dict:
  """What compute-sanitizer's output `text` reports (every process it
  followed; the program's own lines, which lack the prefix, are ignored).

  Returns:
    ``{"summaries": summary lines found, "errors": the total of their error
    counts (racecheck's warnings counted as errors), "reports": {headline:
    count} (each report's first line, without addresses), "defects": how
    many reports match `DEFECT`}``.
  """
  summaries, errors, reports, defects = 0, 0, {}, 0
  for line in text.splitlines():
    if not line.startswith(PREFIX + " ") or line.startswith(PREFIX + "  "):
      continue  # not the sanitizer's, or a report's continuation line
    body = line[len(PREFIX) + 1:].strip()
    m = _ERROR_SUMMARY.search(body)
    if m:
      summaries += 1
      errors += int(m.group(1))
      continue
    m = _RACE_SUMMARY.search(body)
    if m:
      summaries += 1
      errors += int(m.group(1)) + int(m.group(2))
      continue
    if not body or _NOT_REPORTS.search(body):
      continue
    headline = re.sub(r"0x[0-9a-fA-F]+", "0x...", body)[:200]
    reports[headline] = reports.get(headline, 0) + 1
    defects += bool(DEFECT.search(body))
  return {"summaries": summaries, "errors": errors, "reports": reports, "defects": defects}


def verdict(unit: Unit, parsed: dict, loopback_rc: int | None,
            cases: dict[str, int] | None) -> tuple[str, list[str]]:
  """("pass" or "fail", why it failed) for `unit` given the parsed report,
  the loopback tool's exit status and its rows per status (module
  docstring's rule)."""
  why = []
  if parsed["summaries"] == 0:
    why.append("no sanitizer summary (the sanitizer did not finish)")
  if loopback_rc != 0:
    why.append(f"the loopback run exited with {loopback_rc}")
  if not cases or not cases.get("pass"):
    why.append("no case passed")
  elif set(cases) - {"pass", "skipped"}:
    why.append(f"cases: {cases}")
  if unit.fault:
    if parsed["defects"]:
      why.append(f"{parsed['defects']} defect report(s) beside the expected trap")
  elif parsed["errors"] or parsed["reports"]:
    why.append(f"{parsed['errors']} sanitizer error(s), reports: "
               f"{sorted(parsed['reports'])[:3]}")
  return ("fail" if why else "pass"), why


# --- running ------------------------------------------------------------------------


def find_sanitizer(explicit: str | None = None) -> str | None:
  """The compute-sanitizer to run: `explicit`, else PATH's, CUDA_HOME's,
  /usr/local/cuda's, or the one beside nvcc; None when there is none."""
  if explicit:
    return explicit if os.access(explicit, os.X_OK) else None
  found = shutil.which("compute-sanitizer")
  if found:
    return found
  dirs = [os.path.join(os.environ[v], "bin") for v in ("CUDA_HOME", "CUDA_PATH")
          if os.environ.get(v)] + ["/usr/local/cuda/bin"]
  nvcc = shutil.which("nvcc")
  if nvcc:
    dirs.append(os.path.dirname(os.path.realpath(nvcc)))
  for d in dirs:
    for path in (os.path.join(d, "compute-sanitizer"),
                 os.path.join(d, "..", "compute-sanitizer", "compute-sanitizer")):
      if os.access(path, os.X_OK):
        return os.path.normpath(path)
  return None


def sanitizer_version(sanitizer: str) -> str | None:
  """The first line of ``compute-sanitizer --version`` that names it."""
  try:
    out = subprocess.run([sanitizer, "--version"], capture_output=True, text=True,
                         timeout=60).stdout
  except (OSError, subprocess.SubprocessError):
    return None
  lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
  return next((ln for ln in lines if "ersion" in ln), lines[0] if lines else None)


def command(sanitizer: str, tool: str, unit: Unit, json_path: str) -> list[str]:
  """The sanitized run of `unit`: the loopback tool (its children followed),
  or for a fault unit the fault child itself."""
  head = [sanitizer, f"--tool={tool}", "--target-processes=all", "--launch-timeout=300",
          "--print-limit=20"]
  if unit.kernels:
    head += ["--kernel-name", f"kns={unit.kernels}"]
  head += [sys.executable, "-m"]
  if unit.fault:
    return head + [lh.CHILD, unit.spec]
  return head + ["jax_llar.tools.loopback", f"--json={json_path}", *unit.args]


def first_report(text: str, limit: int = 40) -> list[str]:
  """The lines of the first report in compute-sanitizer's output `text`
  (a defect's if there is one): its headline and continuation lines."""
  lines = text.splitlines()
  starts = [k for k, ln in enumerate(lines)
            if ln.startswith(PREFIX + " ") and not ln.startswith(PREFIX + "  ")
            and ln[len(PREFIX) + 1:].strip()
            and not _NOT_REPORTS.search(ln) and not _ERROR_SUMMARY.search(ln)]
  if not starts:
    return []
  k = next((k for k in starts if DEFECT.search(lines[k])), starts[0])
  out = [lines[k]]
  for ln in lines[k + 1:k + limit]:
    if not ln.startswith(PREFIX + "  "):
      break
    out.append(ln)
  return out


def _problem_cases(record: dict | None, limit: int = 3) -> list[dict]:
  """The first rows of a loopback record that neither passed nor were
  skipped, with the fields that say why."""
  keys = ("world_size", "dtype", "weight_dtype", "rows", "d", "bytes_per_rank", "start_epoch",
          "status", "reason", "cuda_error", "first_mismatch", "problems")
  rows = [r for r in (record or {}).get("rows", []) if r["status"] not in ("pass", "skipped")]
  return [{k: r[k] for k in keys if k in r} for r in rows[:limit]]


def run_unit(sanitizer: str, tool: str, unit: Unit, work: str, timeout_s: float) -> dict:
  """Runs `unit` under `tool`; returns its row."""
  json_path = os.path.join(work, f"{tool}-{unit.name}.json")
  cmd = command(sanitizer, tool, unit, json_path)
  env = dict(os.environ)
  env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  env.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", lh.MAX_CONNECTIONS)
  row = {"tool": tool, "unit": unit.name, "fault": unit.fault,
         "command": " ".join("python" if c == sys.executable else c for c in cmd[1:])}
  t0 = time.monotonic()
  try:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    text, rc = p.stdout + p.stderr, p.returncode
  except subprocess.TimeoutExpired as e:
    out = e.stdout or ""
    text = (out.decode(errors="replace") if isinstance(out, bytes) else out)
    rc = None
    row["timed_out"] = True
  row["seconds"] = round(time.monotonic() - t0, 1)
  parsed = parse_report(text)
  cases: dict[str, int] = {}
  if unit.fault:
    data = next((json.loads(ln) for ln in reversed(text.splitlines())
                 if ln.startswith("{") and ln.rstrip().endswith("}")), None)
    problems = lh.fault_problems(json.loads(unit.spec), data)
    cases = {"fail": 1} if problems else {"pass": 1}
    if problems:
      row["problem_cases"] = [{"problems": problems}]
  else:
    record = None
    if os.path.exists(json_path):
      try:
        with open(json_path) as f:
          record = json.load(f)
      except (OSError, json.JSONDecodeError):
        record = None
    for r in (record or {}).get("rows", []):
      cases[r["status"]] = cases.get(r["status"], 0) + 1
    if _problem_cases(record):
      row["problem_cases"] = _problem_cases(record)
  status, why = verdict(unit, parsed, rc, cases)
  if row.get("timed_out"):
    why.insert(0, f"did not finish within {timeout_s:g} s")
    status = "fail"
  row.update(status=status, sanitizer_errors=parsed["errors"], defects=parsed["defects"],
             expected=parsed["errors"] if unit.fault and status == "pass" else 0,
             reports=parsed["reports"], loopback_rc=rc, cases=cases)
  if parsed["reports"]:
    row["first_report"] = first_report(text)
  if why:
    row["why"] = why
    row["tail"] = text[-3000:]
  return row


def run(sanitizer: str, tools: Sequence[str], units: Sequence[Unit], jobs: int,
        unit_timeout_s: float, max_seconds: float | None = None) -> list[dict]:
  """Every (tool, unit) the unit admits: the clean units up to `jobs` at once
  (each its own processes and CUDA contexts, which the GPU time-slices),
  then the fault units one at a time (a trapping context beside others made
  kernels of those miss their bounds by tens of seconds on one H200), printing
  a line per finished run. Runs not started within `max_seconds` get a
  "not_run" row.

  Returns:
    The rows in (unit, tool) order.
  """
  pairs = [(tool, unit) for unit in units for tool in tools
           if not unit.tools or tool in unit.tools]
  deadline = None if max_seconds is None else time.monotonic() + max_seconds
  work = tempfile.mkdtemp(prefix="jax_llar_sanitize_")

  def go(tool: str, unit: Unit) -> dict:
    if deadline is not None and time.monotonic() > deadline:
      return {"tool": tool, "unit": unit.name, "fault": unit.fault, "status": "not_run",
              "why": [f"--max_seconds ({max_seconds:g} s) passed before it started"]}
    row = run_unit(sanitizer, tool, unit, work, unit_timeout_s)
    print(line(row), flush=True)
    return row

  done: dict[tuple[str, str], dict] = {}
  # The clean runs start slowest tool first (`START_ORDER`), so that the
  # last ones to start are short and the runs end close together.
  clean = sorted(((t, u) for t, u in pairs if not u.fault), key=lambda p: START_ORDER[p[0]])
  with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
    futures = {(t, u.name): pool.submit(go, t, u) for t, u in clean}
    done.update({k: f.result() for k, f in futures.items()})
  for t, u in pairs:
    if u.fault:
      done[(t, u.name)] = go(t, u)
  shutil.rmtree(work, ignore_errors=True)
  return [done[(t, u.name)] for t, u in pairs]


def line(row: dict) -> str:
  """One row as a line of the table."""
  head = f"{row['tool']:9s} {row['unit']:45s} {row['status'].upper():7s}"
  if row["status"] == "not_run":
    return head + " " + row["why"][0]
  text = (f"{head} errors={row['sanitizer_errors']} defects={row['defects']} "
          f"expected={row['expected']} cases={row['cases']} {row['seconds']:.0f}s")
  if row.get("why"):
    text += " (" + "; ".join(row["why"]) + ")"
  return text


