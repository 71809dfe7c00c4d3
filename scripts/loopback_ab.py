"""Per-call time of kernels on the loopback harness, one build against another.

  python scripts/loopback_ab.py --before DIR [--algorithms two_shot_ll128,...]
      [--rounds 3] [--out FILE]

Run from the repository root of the "after" tree (its extension installed or
built in place), on one GPU. DIR is the "before" tree with its extension
built in place: for a commit C,

  git archive --prefix=before/ C ffi jax_llar pyproject.toml | tar x -C /tmp
  cmake -S /tmp/before/ffi -B /tmp/before/build -G Ninja \\
      -DCMAKE_CUDA_ARCHITECTURES=90 -DPython_EXECUTABLE=$(which python3)
  ninja -C /tmp/before/build
  cp /tmp/before/build/{libllar_core.so,_llar.*.so,_build_info.py} /tmp/before/jax_llar/
  cp /tmp/before/build/_llar_tools.*.so /tmp/before/jax_llar/tools/

For each algorithm and round it runs ``python -m jax_llar.tools.loopback``
(outputs checked; a failed case fails the script) once per build, the order
alternating from round to round, with no synchronisation between calls
(--sizes, --worlds, --dtypes, --calls); a row's time is the native launch
loop's wall time over its calls: W simulated ranks' kernels on one GPU, so
below a few hundred KiB the launches (about 3.4 us per rank's kernel on one
H200) set it, not the kernels. Prints, per (algorithm, world, dtype, size),
the median of each build's rounds and their ratio, and writes every round's
figure to --out (JSON). What two builds of the same machine code differ by
in such a run (1-5% on one H200, benchmarks/NOTES.md entry 71) is the
resolution of the comparison.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile

from absl import app, flags

BEFORE = flags.DEFINE_string("before", None, "The before tree, its extension built in place.",
                             required=True)
ALGORITHMS = flags.DEFINE_list("algorithms", ["two_shot_ll128", "two_shot_ll128_atomic"],
                               "Algorithms (the loopback tool's short names).")
WORLDS = flags.DEFINE_string("worlds", "2,4,8", "Simulated world sizes.")
DTYPES = flags.DEFINE_string("dtypes", "float32,bfloat16", "Element types.")
SIZES = flags.DEFINE_string("sizes", "65540,262148,1048580,4194304", "Bytes per rank.")
CALLS = flags.DEFINE_integer("calls", 400, "Calls per case.", lower_bound=1)
ROUNDS = flags.DEFINE_integer("rounds", 3, "Runs of each build per algorithm.", lower_bound=1)
OUT = flags.DEFINE_string("out", None, "Write every round's figures here (JSON).")


def run(which: str, algorithm: str, work: str) -> dict:
  """One loopback run of `algorithm` with the `which` build: {(world, dtype,
  bytes): microseconds per call} of the passed rows."""
  path = os.path.join(work, f"{which}-{algorithm}.json")
  env, cwd = dict(os.environ), os.getcwd()
  if which == "before":
    env["PYTHONPATH"] = cwd = os.path.abspath(BEFORE.value)
  p = subprocess.run([sys.executable, "-m", "jax_llar.tools.loopback", f"--algorithm={algorithm}",
                      f"--json={path}", f"--worlds={WORLDS.value}", f"--dtypes={DTYPES.value}",
                      f"--sizes={SIZES.value}", f"--calls={CALLS.value}", "--keep=1", "--sets=2",
                      "--no_sync", "--timeout_ms=10000"],
                     cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
  if p.returncode != 0 or not os.path.exists(path):
    raise SystemExit(f"{which} {algorithm}: the loopback run failed\n{p.stdout[-2000:]}"
                     f"\n{p.stderr[-2000:]}")
  with open(path) as f:
    rows = json.load(f)["rows"]
  return {(r["world_size"], r["dtype"], r["bytes_per_rank"]): r["seconds"] / r["calls"] * 1e6
          for r in rows if r["status"] == "pass"}


def main(argv):
  del argv
  figures: dict = {}
  with tempfile.TemporaryDirectory() as work:
    for algorithm in ALGORITHMS.value:
      for k in range(ROUNDS.value):
        for which in (("before", "after") if k % 2 == 0 else ("after", "before")):
          for key, us in run(which, algorithm, work).items():
            figures.setdefault((algorithm,) + key, {"before": [], "after": []})[which].append(us)
  rows = []
  print(f"{'algorithm':24s} {'W':>2s} {'dtype':9s} {'bytes':>8s} {'before us':>10s} "
        f"{'after us':>10s} {'after/before':>12s}")
  for key in sorted(figures):
    v = figures[key]
    if not v["before"] or not v["after"]:
      continue
    b, a = statistics.median(v["before"]), statistics.median(v["after"])
    rows.append({"algorithm": key[0], "world": key[1], "dtype": key[2], "bytes": key[3],
                 "before_us": v["before"], "after_us": v["after"], "before_median_us": b,
                 "after_median_us": a, "ratio": a / b})
    print(f"{key[0]:24s} {key[1]:2d} {key[2]:9s} {key[3]:8d} {b:10.2f} {a:10.2f} {a / b:12.3f}")
  if OUT.value:
    with open(OUT.value, "w") as f:
      json.dump({"rounds": ROUNDS.value, "calls": CALLS.value, "rows": rows}, f, indent=1)


if __name__ == "__main__":
  app.run(main)
