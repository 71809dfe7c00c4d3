"""Every production kernel under NVIDIA's compute-sanitizer, through the loopback harness.

  python -m jax_llar.tools.sanitize [--tools=memcheck,racecheck,synccheck,initcheck]
      [--matrix=full|small] [--units=NAME,...] [--jobs=8] [--noprobe]
      [--json=F | --out=DIR --tag=T]

Needs one CUDA GPU, the CUDA extension and ``compute-sanitizer`` (CUDA's;
found on PATH, in CUDA_HOME/bin or beside nvcc, or given with --sanitizer).
What runs, and the verdict per (tool, unit): jax_llar.tools.sanitize.harness.

Results: a table on stdout and a JSON file (--json, else
OUT/<machine>-<yyyymmdd>-sanitize<tag>.json): ``{"env", "level":
"sanitize", "note", "sanitizer": {"path", "version"}, "matrix": {"name",
"units"}, "rows"}`` (rows: sanitize_harness.run_unit). The exit status is 1
when any unit failed.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys

from absl import flags

from jax_llar.tools import _cli, report
from jax_llar.tools.sanitize import harness as sh
from jax_llar.tools.sanitize.harness import MATRICES, NOTE, TOOLS

TOOLS_FLAG = flags.DEFINE_list("tools", list(TOOLS), f"compute-sanitizer tools: {TOOLS}.")
MATRIX = flags.DEFINE_enum("matrix", "full", list(MATRICES),
                           "full: every kernel (module docstring); small: the one-GPU "
                           "suite's cross-section.")
UNITS = flags.DEFINE_list("units", [], "Only these units of the matrix (names as printed; "
                          "default: all).")
JOBS = flags.DEFINE_integer("jobs", 8, "Sanitized runs at once.", lower_bound=1,
                            upper_bound=64)
UNIT_TIMEOUT_S = flags.DEFINE_float("unit_timeout_s", 420.0,
                                    "Bound on one sanitized run, seconds.", lower_bound=1.0,
                                    upper_bound=3600.0)
MAX_SECONDS = flags.DEFINE_float("max_seconds", None, "Start no run after this many "
                                 "seconds (those not started fail as not run).",
                                 lower_bound=1.0, upper_bound=7 * 86_400.0)
PROBE = flags.DEFINE_bool("probe", True, "First check, in a child process, that the CUDA "
                          "extension loads (--noprobe: the caller knows it does, as the "
                          "one-GPU suite does).")
SANITIZER = flags.DEFINE_string("sanitizer", None, "Path of compute-sanitizer (default: "
                                "found on PATH, in CUDA_HOME/bin or beside nvcc).")
JSON = flags.DEFINE_string("json", None, "Write the result to this file (default: "
                           "OUT/<machine>-<yyyymmdd>-sanitize<tag>.json).")
OUT = flags.DEFINE_string("out", report.default_out_dir(), report.OUT_HELP)
TAG = flags.DEFINE_string("tag", "", f"Suffix of the result file name: {_cli.TAG_RULE}.")
_cli.register_tag_validator()


def main() -> int:
  bad = sorted(set(TOOLS_FLAG.value) - set(TOOLS))
  if bad or not TOOLS_FLAG.value:
    print(f"jax_llar.tools.sanitize: --tools must be among {', '.join(TOOLS)}: "
          f"{','.join(bad) or '(none)'}")
    return 1
  units = MATRICES[MATRIX.value]
  if UNITS.value:
    names = {u.name for u in units}
    unknown = sorted(set(UNITS.value) - names)
    if unknown:
      print(f"jax_llar.tools.sanitize: no unit {', '.join(unknown)} in --matrix="
            f"{MATRIX.value} (units: {', '.join(sorted(names))})")
      return 1
    units = tuple(u for u in units if u.name in UNITS.value)
  # Where the result goes, before any work.
  if JSON.value is not None:
    _cli.writable_file(JSON.value, "json")
  else:
    _cli.writable_folder(OUT.value)
  sanitizer = sh.find_sanitizer(SANITIZER.value)
  if sanitizer is None:
    print("jax_llar.tools.sanitize needs NVIDIA's compute-sanitizer (CUDA toolkit): "
          + (f"{SANITIZER.value} is not executable" if SANITIZER.value else
             "not on PATH, in CUDA_HOME/bin or beside nvcc; give --sanitizer"))
    return 1
  # The children need the GPU; say so once here rather than in every row.
  probe = subprocess.run([sys.executable, "-c", "import sys, jax_llar.tools._native as n; "
                          "sys.exit(0 if n.load() is not None else n.reason())"],
                         capture_output=True, text=True, timeout=600) if PROBE.value else None
  if probe is not None and probe.returncode != 0:
    print("jax_llar.tools.sanitize needs one CUDA GPU and the CUDA extension: "
          + (probe.stderr.strip().splitlines() or ["the probe failed"])[-1])
    return 1
  version = sh.sanitizer_version(sanitizer)
  print(f"{NOTE}\n{sanitizer} ({version}); {len(units)} unit(s) x {len(TOOLS_FLAG.value)} "
        f"tool(s), {JOBS.value} at once", flush=True)
  rows = sh.run(sanitizer, TOOLS_FLAG.value, units, JOBS.value, UNIT_TIMEOUT_S.value,
             MAX_SECONDS.value)
  result = {"env": report.environment(), "level": "sanitize", "note": NOTE,
            "sanitizer": {"path": sanitizer, "version": version},
            "matrix": {"name": MATRIX.value,
                       "units": [dataclasses.asdict(u) for u in units]},
            "rows": rows}
  if JSON.value:
    report.write_json(JSON.value, result)
    path = JSON.value
  else:
    path = report.save(result, OUT.value, report.stem("sanitize", TAG.value))[0]
  failed = [r for r in rows if r["status"] != "pass"]
  totals = {t: sum(r.get("sanitizer_errors", 0) for r in rows
                   if r["tool"] == t and not r["fault"]) for t in TOOLS_FLAG.value}
  print("sanitizer errors in clean units: " + ", ".join(f"{t} {n}" for t, n in totals.items()))
  print(f"units: {len(rows) - len(failed)} passed, {len(failed)} failed; saved {path}")
  return 1 if failed else 0


if __name__ == "__main__":
  _cli.run(main)
