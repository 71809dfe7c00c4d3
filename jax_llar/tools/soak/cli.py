"""Soak: millions of consecutive checked all-reduce calls, mixed sizes,
dtypes and algorithms, until one fails or the count is reached.

  python -m jax_llar.tools.soak --calls 2200000 [--mode jax|loopback]
      [--algorithms one_shot_ll,two_shot_ll] [--dtypes float32,bfloat16,float16,int32]
      [--max_bytes 262144] [--seed 0] [--json FILE]

Every call's output on every rank is compared bit for bit with the fast
path's promise, a float64 sum in rank order rounded once (NaNs by position:
jax_llar.testing), and every rank must hold the same bits. Input sets carry
special values (signed zeros, subnormals, inf, NaNs) and, for float dtypes,
every NaN bit pattern and all-ones words. In jax mode a wrong sum is counted
and the soak goes on; in loopback mode a case with a wrong sum ends it (its
report names the first mismatch). A failed call (the bounded wait's error, a
lost CUDA context) ends the soak at once with its report. The goal of issue
12: at least 2.2 million consecutive checked calls, no mismatch, no hang.

Modes:
  jax       (2+ GPUs) jitted shard_map programs of --psums_per_program
            jax_llar.psum calls of mixed sizes, each program compiled with one
            algorithm forced (the dispatch log must show that it ran; a
            program whose sizes the algorithm does not serve is skipped and
            said so), run over --sets input sets; a call is one psum of one
            program step, on all ranks. The real path: XLA, CUDA graphs,
            NVLink.
  loopback  (1 GPU) the loopback harness (jax_llar.tools.loopback): groups of
            2-16 ranks simulated on one GPU, random (algorithm, ranks,
            dtype, size, synchronised or not) cases of up to
            --calls_per_case consecutive calls, every call checked. The
            protocol logic and the reductions, not NVLink, not XLA.
  auto      jax with 2+ GPUs, else loopback.

A progress line every --progress_s seconds gives the calls checked, the
rate, the mismatches and an estimate of the time left. The final record
(level "soak"; --json, else OUT/<machine>-<yyyymmdd>-soak<tag>.json) holds
the calls checked per algorithm, dtype and world size, the mismatches, the
first failure and the wall time, written atomically. Exit status 0 only
when every requested call was checked and none mismatched or failed.

The command line is checked before anything runs: the dtypes, algorithms
and world sizes must be known, the output folder (or --json's) writable,
the numbers within their bounds (--help); a refusal is one line, status 1.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from absl import flags

from jax_llar import algorithms
from jax_llar.algorithms import LARGEST_MAX_BYTES, MAX_RANKS
from jax_llar.tools import _cli, report
from jax_llar.tools.soak.run import Tally, run_jax, run_loopback

CALLS = flags.DEFINE_integer("calls", 2_200_000, "Checked all-reduce calls to run.",
                             lower_bound=1, upper_bound=10**12)
MODE = flags.DEFINE_enum("mode", "auto", ["auto", "jax", "loopback"],
                         "jax: real GPUs through XLA (2+ GPUs); loopback: ranks "
                         "simulated on one GPU; auto: jax with 2+ GPUs, else loopback.")
ALGORITHMS_F = flags.DEFINE_list("algorithms", [],
                                 "Algorithms to mix (short names; default: every one "
                                 "the mode can run).")
DTYPES_F = flags.DEFINE_list("dtypes", ["float32", "bfloat16", "float16", "int32"],
                             "Element types to mix.")
MAX_BYTES_F = flags.DEFINE_integer("max_bytes", 256 * 1024,
                                   "Largest payload per rank, bytes (each algorithm "
                                   "also stops at its own limit).", lower_bound=4,
                                   upper_bound=LARGEST_MAX_BYTES)
WORLDS_F = flags.DEFINE_list("worlds", ["2", "3", "4", "8"],
                             f"loopback: simulated world sizes to mix, 2-{MAX_RANKS}.")
CALLS_PER_CASE = flags.DEFINE_integer("calls_per_case", 4000,
                                      "loopback: consecutive calls per case, at most.",
                                      lower_bound=1, upper_bound=10**7)
PSUMS = flags.DEFINE_integer("psums_per_program", 64,
                             "jax: psums per program (mixed sizes).", lower_bound=1,
                             upper_bound=4096)
STEPS = flags.DEFINE_integer("steps_per_program", 500,
                             "jax: steps each program runs before the next one.",
                             lower_bound=1, upper_bound=10**7)
SETS = flags.DEFINE_integer("sets", 4, "Input sets per program or case; a call uses "
                            "one of them in turn.", lower_bound=1, upper_bound=64)
TIMEOUT_MS = flags.DEFINE_integer("timeout_ms", 5000, "The kernels' bound on every "
                                  "wait (loopback; jax: JAX_LLAR_TIMEOUT_MS).",
                                  lower_bound=1, upper_bound=600_000)
PROGRESS_S = flags.DEFINE_float("progress_s", 10.0, "Seconds between progress lines.",
                                 lower_bound=0.1, upper_bound=86_400.0)
MAX_SECONDS = flags.DEFINE_float("max_seconds", None,
                                 "Stop after this many seconds with the record so far "
                                 "(the soak then counts as unfinished, exit status 1).",
                                 lower_bound=0.0, upper_bound=365 * 86_400.0)
SEED = flags.DEFINE_integer("seed", 0, "Seed of the random cases and inputs "
                            f"{_cli.SEED_RANGE}.", **_cli.SEED_BOUNDS)
JSON = flags.DEFINE_string("json", None, "Write the record to this file.")
OUT = flags.DEFINE_string("out", report.default_out_dir(), report.OUT_HELP)
TAG = flags.DEFINE_string("tag", "", f"Suffix of the result file name: {_cli.TAG_RULE}.")

DTYPES = {"float32": "float32", "f32": "float32", "bfloat16": "bfloat16",
          "bf16": "bfloat16", "float16": "float16", "f16": "float16",
          "int32": "int32", "i32": "int32"}
ALGORITHM_NAMES = tuple(a.short_name for a in algorithms.Algorithm)

_cli.register_int_list_validator("worlds", 2, MAX_RANKS, "simulated world sizes")
_cli.register_choices_validator("algorithms", ALGORITHM_NAMES, allow_empty=True,
                                what="algorithms among " + ", ".join(ALGORITHM_NAMES))
_cli.register_tag_validator()



def main() -> int:
  from jax_llar.tools.loopback import harness as lh
  mode = MODE.value
  try:
    dtypes = [DTYPES[d] for d in DTYPES_F.value]
  except KeyError as e:
    print(f"jax_llar.tools.soak: unknown dtype {e.args[0]!r}; known: {', '.join(DTYPES)}")
    return 1
  if not dtypes:
    raise _cli.Refused(f"--dtypes is empty; known: {', '.join(DTYPES)}")
  if JSON.value is not None:
    json_path = _cli.writable_file(JSON.value, "json")
  else:
    out_dir = _cli.writable_folder(OUT.value)
  import jax
  gpus = [d for d in jax.devices() if d.platform == "gpu"]
  if mode == "auto":
    mode = "jax" if len(gpus) >= 2 else "loopback"
  if mode == "jax" and len(gpus) < 2:
    print("jax_llar.tools.soak: --mode jax needs 2+ GPUs (found "
          f"{len(gpus)}); --mode loopback simulates the ranks on one GPU")
    return 1
  if mode == "loopback":
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", lh.MAX_CONNECTIONS)
    if not gpus:
      print("jax_llar.tools.soak: no CUDA GPU here (--mode "
            f"{MODE.value}): the soak needs one GPU (--mode loopback, ranks simulated "
            "on it) or 2+ (--mode jax, through XLA)")
      return 1
  known = [a.short_name for a in algorithms.Algorithm]
  if mode == "loopback":
    known = [a for a in known if a in lh.ALGORITHMS]
  algs = list(ALGORITHMS_F.value) or known
  bad = [a for a in algs if a not in known]
  if bad:
    print(f"jax_llar.tools.soak: {mode} mode cannot run {', '.join(bad)}; it runs "
          f"{', '.join(known)}")
    return 1
  rng = np.random.default_rng(SEED.value)
  tally = Tally(CALLS.value)
  if MAX_SECONDS.value is not None:
    tally.max_seconds = MAX_SECONDS.value
  print(f"soak: {CALLS.value:,d} calls, mode {mode}, algorithms {', '.join(algs)}, "
        f"dtypes {', '.join(dtypes)}, up to {MAX_BYTES_F.value} bytes per rank", flush=True)
  if mode == "loopback":
    run_loopback(tally, algs, dtypes, [int(w) for w in WORLDS_F.value], MAX_BYTES_F.value,
                 CALLS_PER_CASE.value, SETS.value, TIMEOUT_MS.value, rng, PROGRESS_S.value)
  else:
    os.environ.setdefault("JAX_LLAR_TIMEOUT_MS", str(TIMEOUT_MS.value))
    run_jax(tally, algs, dtypes, MAX_BYTES_F.value, PSUMS.value, STEPS.value, SETS.value,
            rng, PROGRESS_S.value)
  tally.progress(0, force=True)
  rec = tally.record()
  out: dict[str, Any] = {"env": report.environment(), "level": "soak", "mode": mode,
                         "settings": {"algorithms": algs, "dtypes": dtypes,
                                      "max_bytes": MAX_BYTES_F.value, "seed": SEED.value,
                                      "worlds": WORLDS_F.value if mode == "loopback"
                                      else None},
                         **rec, "rows": []}
  if JSON.value is not None:
    report.write_json(json_path, out)
    path = json_path
  else:
    path = report.save(out, out_dir, report.stem("soak", TAG.value))[0]
  verdict = "PASSED" if rec["passed"] else "FAILED"
  print(f"soak {verdict}: {rec['calls_checked']:,d} calls checked, {rec['mismatches']} "
        f"mismatches, failure: {rec['failure'] is not None}"
        f"{', stopped at --max_seconds' if rec['stopped_at_max_seconds'] else ''}; "
        f"saved {path}", flush=True)
  return 0 if rec["passed"] else 1


if __name__ == "__main__":
  _cli.run(main)
