"""Measures this machine and writes the tuning tables jax_llar dispatches by.

  python -m jax_llar.tools.tune                        measure, write the tables
  python -m jax_llar.tools.tune --from_results FILE    build them from saved results
  python -m jax_llar.tools.tune --verify               measure, write, then verify them

Measuring needs 2+ CUDA GPUs driven by this process and the CUDA extension.
For each number of ranks the local GPUs can form (2, 4, 8, 16 up to their
number, and their number), each payload size per rank (powers of two from
--min_bytes to --max_bytes, or --sizes) and each dtype, it times lax.psum and
every jax_llar algorithm that serves the size (but the non-deterministic
ones, jax_llar.algorithms.NON_DETERMINISTIC), each forced in turn, with the
JAX level's method: the per-step slope of a jitted chain of K all-reduces
between two chain lengths, every output first checked bitwise against its
reference on random data in the same run. Above --long_chain_bytes the
chains are shortened in proportion to the size (at least 16 and 2 steps), so
that a 64 MiB step does not take as long as 256 thousand small ones.

Then, per number of ranks, it builds a table by the rule of
jax_llar.tools.tune.tables.RULE: per size the fastest algorithm replaces lax.psum only
when it beats lax.psum by --margin for every dtype; neighbouring sizes with
the same choice merge into one row; sizes above the last row go to
lax.psum. A row whose output matched no reference stops the build (the
measurements are still saved). The tables go to --out (default: the tuning
directory, JAX_LLAR_TUNING_DIR, ~/.cache/jax_llar/tuning), where jax_llar
reads them ahead of its shipped tables; the measurements go to
--results_out as <machine>-<yyyymmdd>-tune.json. A long run prints a line
per size with the time left, estimated from the mean time per measurement
so far (larger sizes take longer, so early estimates run low). Narrow a run
with --ranks, --min_bytes, --max_bytes, --dtypes and --algorithms, and join
runs with --from_results a.json,b.json.

--verify (or --verify_from a saved tune result, without the tuning pass)
then checks the tables in use: per size and dtype one interleaved run of
lax.psum, the automatic choice (llar.auto, which reads the new tables) and
the fastest algorithm of the tuning pass, saved as
<machine>-<yyyymmdd>-tune-verify.json with the verdicts of issue 11 per row
(never slower than lax.psum; within 5% of the best single choice; 3x
lax.psum up to 1 MiB), each also printed with the sizes that miss it.

With --from_results the tables are built from saved JAX-level result files
(this tool's, or python -m jax_llar.tools.bench --level jax) without
measuring; --architecture names the GPUs' architecture (e.g. sm_90) where
the files do not record their compute capability. The method: the
repository's benchmarks/METHOD.md.
"""

from __future__ import annotations

import os
import sys
import time

from absl import flags

from jax_llar import jsonfile, table_lookup, tuning
from jax_llar.algorithms import MAX_BYTES, MAX_RANKS, NON_DETERMINISTIC, Algorithm
from jax_llar.config import settings
from jax_llar.tools import _cli, host, progress, report
from jax_llar.tools.bench import jax_level as jax_level
from jax_llar.tools.tune import tables as tune_tables
from jax_llar.tools.tune.plan import (AUTO, chain_lengths, default_ranks, default_sizes,
                                      fastest, from_results_command, verdicts)

# The longest bound a run may be given, seconds (a week).
MAX_RUN_SECONDS = 7 * 86_400

# What a tuning table may choose: every algorithm but the non-deterministic
# ones (floating-point atomics), which only JAX_LLAR_ALGORITHM runs.
_NAMES = [a.short_name for a in Algorithm if a not in NON_DETERMINISTIC]

FROM_RESULTS = flags.DEFINE_list(
    "from_results", None,
    "Build the tables from these saved JAX-level result files instead of "
    "measuring (comma list; no GPU needed).")
ARCHITECTURE = flags.DEFINE_string(
    "architecture", None,
    "With --from_results: the GPUs' architecture, e.g. sm_90 (compute "
    "capability 9.0), for result files that do not record it.")
OUT = flags.DEFINE_string(
    "out", None,
    "Folder for the tables (default: the tuning directory, JAX_LLAR_TUNING_DIR, "
    "~/.cache/jax_llar/tuning).")
RESULTS_OUT = flags.DEFINE_string(
    "results_out", None,
    "Folder for the measurements' result file (default: the tables' folder).")
RANKS = flags.DEFINE_list(
    "ranks", None,
    "Numbers of ranks to measure (default: 2, 4, 8, 16 up to the local GPUs, "
    "and their number).")
SIZES = flags.DEFINE_list(
    "sizes", None, "Payload sizes, bytes per rank (default: powers of two from "
    "--min_bytes to --max_bytes).")
MIN_BYTES = flags.DEFINE_integer("min_bytes", 8, "Smallest payload, bytes per rank.",
                                 lower_bound=1, upper_bound=jax_level.MAX_SIZE)
MAX_BYTES_FLAG = flags.DEFINE_integer("max_bytes", 64 << 20,
                                      "Largest payload, bytes per rank.", lower_bound=1,
                                      upper_bound=jax_level.MAX_SIZE)
DTYPES = flags.DEFINE_list("dtypes", ["f32", "bf16"],
                           "Element types: f32, bf16, f16 (or float32, bfloat16, float16).")
ALGORITHMS = flags.DEFINE_list("algorithms", _NAMES,
                               "jax_llar algorithms to measure (lax.psum always is).")
K_SHORT = flags.DEFINE_integer("k_short", 32, "Short chain length, steps.", lower_bound=1,
                               upper_bound=jax_level.MAX_STEPS - 1)
K_LONG = flags.DEFINE_integer("k_long", 512, "Long chain length, steps.", lower_bound=2,
                              upper_bound=jax_level.MAX_STEPS)
LONG_CHAIN_BYTES = flags.DEFINE_integer(
    "long_chain_bytes", 256 << 10,
    "Above this payload per rank the chains are shortened in proportion.",
    lower_bound=1, upper_bound=jax_level.MAX_SIZE)
CALLS = flags.DEFINE_integer("calls", 60,
                             "Timed calls per chain length and implementation.",
                             lower_bound=1, upper_bound=jax_level.MAX_CALLS)
ROUNDS = flags.DEFINE_integer("rounds", 6, "Interleaved timing rounds.", lower_bound=1,
                              upper_bound=jax_level.MAX_ROUNDS)
MARGIN = flags.DEFINE_float(
    "margin", tune_tables.DEFAULT_MARGIN,
    "How much faster than lax.psum (a fraction) an algorithm must be at a size, "
    "for every dtype, to replace it there.", lower_bound=0.0, upper_bound=0.99)
SEED = flags.DEFINE_integer("seed", 0, f"Seed of the random inputs {_cli.SEED_RANGE}.",
                            **_cli.SEED_BOUNDS)
ALLOW_UNSIGNED = flags.DEFINE_bool(
    "allow_unsigned", False,
    "Let the tables choose the algorithms whose lines carry no call signature "
    "(outside jax_llar.algorithms.SIGNED: a mispaired call of one would not be "
    "detected); by default they are measured but never chosen.")

STORE_ATOMICITY = flags.DEFINE_list(
    "store_atomicity", [],
    "Store-atomicity records (python -m jax_llar.tools.store_atomicity) that let the "
    "tables choose the LL128 algorithms: they must have passed across two devices, "
    "in both directions; without them the LL128 algorithms are measured but never "
    "chosen (jax_llar.algorithms.NEEDS_STORE_ATOMICITY).")

MAX_SECONDS = flags.DEFINE_float(
    "max_seconds", 0.0,
    "Stop the tuning pass before a measurement that would start after this long "
    "(0: no limit); the tables are built from the sizes measured until then "
    "(larger sizes keep lax.psum), and the run says which were left out.",
    lower_bound=0.0, upper_bound=MAX_RUN_SECONDS)
VERIFY_MAX_SECONDS = flags.DEFINE_float(
    "verify_max_seconds", 0.0,
    "The same bound for the verification run (0: no limit).", lower_bound=0.0,
    upper_bound=MAX_RUN_SECONDS)
VERIFY = flags.DEFINE_bool(
    "verify", False,
    "After writing the tables, a verification run: per size and dtype, lax.psum, "
    "the automatic choice (reading the tables just written) and the fastest "
    "algorithm of the tuning pass, measured together; saved as "
    "<machine>-<yyyymmdd>-tune-verify.json with issue 11's verdicts. The tables "
    "must go to the tuning directory (leave --out unset; set JAX_LLAR_TUNING_DIR).")
VERIFY_FROM = flags.DEFINE_string(
    "verify_from", None,
    "Measure nothing but the verification run (see --verify) of the tables in "
    "the tuning directory, with the fastest algorithms of this saved tune result.")

_cli.register_int_list_validator("ranks", 2, MAX_RANKS, "numbers of ranks")
_cli.register_int_list_validator("sizes", 1, jax_level.MAX_SIZE, "sizes in bytes per rank")
flags.register_validator(
    "dtypes", lambda v: bool(v) and all(d in ("f32", "bf16", "f16", "float32",
                                              "bfloat16", "float16") for d in v),
    "--dtypes must name f32, bf16 or f16 (or float32, bfloat16, float16)")
flags.register_validator(
    "algorithms", lambda v: bool(v) and all(a in _NAMES for a in v),
    "--algorithms must name " + ", ".join(_NAMES) + " (not a non-deterministic one: "
    + ", ".join(sorted(a.short_name for a in NON_DETERMINISTIC))
    + ", which no tuning table may choose)")
flags.register_validator(
    "sizes", lambda v: v is None or all(s.isdigit() and int(s) > 0 for s in v),
    "--sizes must be positive integers (bytes per rank)")
flags.register_validator(
    "ranks", lambda v: v is None or all(s.isdigit() and 2 <= int(s) <= MAX_RANKS for s in v),
    f"--ranks must be integers in 2..{MAX_RANKS}")


@flags.multi_flags_validator(["k_short", "k_long"],
                             message="--k_long must be larger than --k_short")
def _chain_lengths(v) -> bool:
  return v["k_long"] > v["k_short"]


def _out_dir() -> str:
  return OUT.value or os.path.expanduser(settings.tuning_dir)


def write_tables(tables) -> None:
  """Writes each table to the tables' folder and prints its rows."""
  for t in tables:
    path = tuning.write(t, _out_dir())
    rows = ", ".join(f"<= {r['max_bytes']} B: {r['algorithm']}" for r in t["rows"]) or (
        "lax.psum at every size")
    print(f"{t['architecture']} x {t['ranks']} ranks: {rows}")
    print(f"  wrote {path}")


_duration = progress.duration


def _release() -> None:
  """Drops the compiled programs of a finished measurement (JAX's caches
  hold them, and with them device memory outside XLA's pool): a tune run
  compiles a few hundred programs, and one that keeps them all can run out
  of device memory."""
  import gc
  import jax
  jax.clear_caches()
  gc.collect()


def _cuda_devices() -> tuple[list, str | None]:
  """The local CUDA devices, or ([], why not)."""
  if not host.gpu_present():
    return [], "no NVIDIA GPU on this machine (or JAX_PLATFORMS excludes CUDA)"
  import jax
  try:
    return list(jax.local_devices(backend="gpu")), None
  except RuntimeError as e:
    return [], f"JAX cannot use the GPUs: {e}"


def measure() -> int:
  """Measures and writes the tables; the exit status."""
  devices, why = _cuda_devices()
  if len(devices) < 2:
    print("jax_llar.tools.tune: measuring needs at least 2 CUDA GPUs driven by this "
          f"process; found {len(devices)}" + (f" ({why})" if why else "") + ". "
          "--from_results builds tables from saved results without GPUs.")
    return 1
  if settings.disabled:
    print("jax_llar.tools.tune: JAX_LLAR_DISABLE is set, so every jax_llar "
          "algorithm would measure lax.psum; unset it")
    return 1
  from jax_llar import _ext
  if _ext.load() is None:
    print(f"jax_llar.tools.tune: the CUDA extension is not active: {_ext.reason()}")
    return 1
  archs = {tuning.architecture_of(d) for d in devices}
  if len(archs) != 1 or None in archs:
    print("jax_llar.tools.tune: the GPUs differ in architecture or have none known: "
          + ", ".join(sorted(str(a) for a in archs)))
    return 1
  arch = archs.pop()

  import numpy as np
  from jax.sharding import Mesh
  import jax_llar
  from jax_llar.tools.bench import jax_level as jax_level

  ranks = [int(r) for r in RANKS.value] if RANKS.value else default_ranks(len(devices))
  too_many = [r for r in ranks if r > len(devices)]
  if too_many:
    print(f"jax_llar.tools.tune: --ranks {too_many} exceed the {len(devices)} local GPUs")
    return 1
  sizes = ([int(s) for s in SIZES.value] if SIZES.value
           else default_sizes(MIN_BYTES.value, MAX_BYTES_FLAG.value))
  algorithms = [Algorithm.from_short_name(a) for a in ALGORITHMS.value]
  units = [(r, s, d) for r in ranks for s in sorted(sizes) for d in DTYPES.value]

  def impls_at(size):
    return ["lax.psum"] + [a.impl for a in algorithms if MAX_BYTES[a] >= size]

  total = sum(len(impls_at(s)) for _, s, _ in units)
  print(f"jax_llar.tools.tune: {arch}, {len(devices)} GPUs; ranks {ranks}; "
        f"{len(sizes)} sizes from {min(sizes)} to {max(sizes)} B; dtypes "
        f"{', '.join(DTYPES.value)}: {len(units)} measurements, {total} "
        "implementation runs",
        flush=True)
  rng = np.random.default_rng(SEED.value)
  rows, done, t0 = [], 0, time.monotonic()
  skipped = []
  for i, (r, size, dt_name) in enumerate(units):
    if MAX_SECONDS.value and time.monotonic() - t0 > MAX_SECONDS.value:
      skipped = units[i:]
      print(f"jax_llar.tools.tune: --max_seconds {MAX_SECONDS.value:g} reached; "
            f"{len(skipped)} measurements left out, from {skipped[0][1]} B "
            f"{skipped[0][2]} on", flush=True)
      break
    mesh = Mesh(np.array(devices[:r]), ("x",))
    impls = impls_at(size)
    ks, kl = chain_lengths(size, K_SHORT.value, K_LONG.value, LONG_CHAIN_BYTES.value)
    got = jax_level.measure(impls, mesh, jax_level.DTYPES[dt_name], size, ks, kl,
                            CALLS.value, ROUNDS.value, rng,
                            forced={a.impl: a for a in algorithms})
    rows += got
    _release()
    done += len(impls)
    elapsed = time.monotonic() - t0
    left = elapsed / done * (total - done)
    times = ", ".join(
        f"{x['impl'].removeprefix('llar.')} {x['us_per_call']:.2f}"
        + ("" if x["correct"] else " WRONG")
        + ("" if x["fast_path"] is not False else " (fell back)") for x in got)
    print(f"[{i + 1}/{len(units)}] {r} ranks {size} B {dt_name} (K {ks}/{kl}): "
          f"{times} us/step; {_duration(elapsed)} elapsed, about "
          f"{_duration(left)} left{host.memory_note()}", flush=True)
  result = {"env": report.environment(), "level": "tune", "architecture": arch,
            "rows": rows,
            "settings": {"ranks": ranks, "sizes": sorted(sizes), "dtypes": DTYPES.value,
                         "algorithms": ALGORITHMS.value, "k_short": K_SHORT.value,
                         "k_long": K_LONG.value,
                         "long_chain_bytes": LONG_CHAIN_BYTES.value,
                         "calls": CALLS.value, "rounds": ROUNDS.value,
                         "margin": MARGIN.value, "seed": SEED.value,
                         "left_out": [{"ranks": r, "bytes_per_rank": b, "dtype": d}
                                      for r, b, d in skipped]},
            "dispatch": [d.to_dict() for d in jax_llar.dispatch_log()][-50:]}
  paths = report.save(result, RESULTS_OUT.value or _out_dir(), report.stem("tune"),
                      plot_title=report.machine_name())
  print(f"saved {', '.join(paths)}")
  command = " ".join(["python -m jax_llar.tools.tune"] + sys.argv[1:])
  try:
    tables = tune_tables.build_tables([paths[0]], command=command, margin=MARGIN.value,
                                 allow_unsigned=ALLOW_UNSIGNED.value,
                                 validated_by=STORE_ATOMICITY.value)
  except (tune_tables.TuningBuildError, OSError, ValueError) as e:
    print(f"jax_llar.tools.tune: no table written: {e}")
    return 1
  write_tables(tables)
  if VERIFY.value:
    return verify(rows, devices)
  return 0


def verify(tuned_rows, devices) -> int:
  """The verification run of the tables in the tuning directory (--verify);
  the exit status (1 when a row's output was wrong)."""
  import numpy as np
  from jax.sharding import Mesh
  import jax_llar
  from jax_llar.tools.bench import jax_level as jax_level

  if OUT.value and os.path.abspath(_out_dir()) != os.path.abspath(
      os.path.expanduser(settings.tuning_dir)):
    print("jax_llar.tools.tune: --verify reads the tables from the tuning directory "
          f"({settings.tuning_dir}); --out {OUT.value} is elsewhere, so nothing to verify")
    return 1
  table_lookup.clear_cache()
  best = fastest(tuned_rows)
  units = sorted({(r["world_size"], r["bytes_per_rank"], r["dtype"]) for r in tuned_rows})
  by_name = {str(jax_level.DTYPES[d]): d for d in jax_level.DTYPES}
  rng = np.random.default_rng(SEED.value + 1)
  rows, t0 = [], time.monotonic()
  print(f"jax_llar.tools.tune: verification run, {len(units)} measurements", flush=True)
  for i, (r, size, dtype) in enumerate(units):
    if r > len(devices):
      continue
    if VERIFY_MAX_SECONDS.value and time.monotonic() - t0 > VERIFY_MAX_SECONDS.value:
      print(f"jax_llar.tools.tune: --verify_max_seconds reached; {len(units) - i} "
            "measurements left out", flush=True)
      break
    mesh = Mesh(np.array(devices[:r]), ("x",))
    b = best.get((r, size, dtype))
    impls = ["lax.psum", AUTO] + ([b["impl"]] if b else [])
    forced = {b["impl"]: Algorithm.from_short_name(b["impl"].removeprefix("llar."))} if b else {}
    ks, kl = chain_lengths(size, K_SHORT.value, K_LONG.value, LONG_CHAIN_BYTES.value)
    got = jax_level.measure(impls, mesh, jax_level.DTYPES[by_name[dtype]], size, ks, kl,
                            CALLS.value, ROUNDS.value, rng, forced=forced)
    rows += got
    _release()
    v = verdicts(got)
    line = ", ".join(f"{x['impl']} {x['us_per_call']:.2f}" + ("" if x["correct"] else " WRONG")
                     for x in got)
    if v:
      line += (f"; auto ran {v[0]['auto_algorithm'] or 'lax.psum'}, "
               f"{v[0]['psum_over_auto']:.2f}x lax.psum")
    print(f"[verify {i + 1}/{len(units)}] {r} ranks {size} B {dtype}: {line} us/step; "
          f"{_duration(time.monotonic() - t0)} elapsed{host.memory_note()}", flush=True)
  found = verdicts(rows)
  result = {"env": report.environment(), "level": "tune-verify",
            "architecture": tuning.architecture_of(devices[0]), "rows": rows,
            "verdicts": found, "tables": table_lookup.tables_seen(),
            "settings": {"k_short": K_SHORT.value, "k_long": K_LONG.value,
                         "long_chain_bytes": LONG_CHAIN_BYTES.value,
                         "calls": CALLS.value, "rounds": ROUNDS.value,
                         "seed": SEED.value + 1},
            "dispatch": [d.to_dict() for d in jax_llar.dispatch_log()][-50:]}
  paths = report.save(result, RESULTS_OUT.value or _out_dir(), report.stem("tune-verify"),
                      plot_title=report.machine_name())
  print(f"saved {', '.join(paths)}")
  for key, label in (("not_slower_than_psum", "never slower than lax.psum"),
                     ("near_best", "within 5% of the best single choice"),
                     ("fast_enough", ">= 3x lax.psum up to 1 MiB")):
    misses = [f"{v['bytes_per_rank']} B {v['dtype']}" for v in found if v[key] is False]
    print(f"{label}: {'yes' if not misses else 'no, at ' + ', '.join(misses)}")
  return 0 if all(v["correct"] for v in found) else 1


def _check_paths() -> None:
  """The flags that name files and folders, before any work: the folders
  written (created and written to), the files read (regular files).

  Raises:
    _cli.Refused: naming the flag.
  """
  for flag in (OUT, RESULTS_OUT):
    if flag.value is not None:
      _cli.writable_folder(flag.value, flag.name, keep=False)
  if VERIFY_FROM.value is not None:
    _cli.readable_json(VERIFY_FROM.value, "verify_from")
  for flag in (STORE_ATOMICITY, FROM_RESULTS):
    for path in flag.value or []:
      if not path.strip():
        raise _cli.Refused(f"--{flag.name} must name files, a comma list without "
                           f"empty entries, got {','.join(flag.value)!r}")
      # --from_results' files are read before any work by the builder, which
      # says what is wrong with each ("--from_results: no table written: <path>: ...").
      why = jsonfile.problem(path) if flag is STORE_ATOMICITY else None
      if why is not None:
        raise _cli.Refused(f"--{flag.name}: {path} {why}")


def main() -> int:
  _check_paths()
  if VERIFY_FROM.value:
    devices, why = _cuda_devices()
    if len(devices) < 2:
      print(f"jax_llar.tools.tune: --verify_from needs 2+ CUDA GPUs; found {len(devices)}"
            + (f" ({why})" if why else ""))
      return 1
    try:
      rows = tune_tables.read_results(VERIFY_FROM.value).get("rows")
    except tune_tables.TuningBuildError as e:
      print(f"jax_llar.tools.tune: --verify_from: {e}")
      return 1
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
      print(f"jax_llar.tools.tune: --verify_from: {VERIFY_FROM.value}: rows must be a "
            "JSON array of objects (a tune result's)")
      return 1
    return verify(rows, devices)
  if flags.FLAGS["from_results"].present:
    paths = list(FROM_RESULTS.value or [])
    if not paths or not all(p.strip() for p in paths):
      print("jax_llar.tools.tune: --from_results must name result files (a comma list "
            f"without empty entries), got {','.join(paths)!r}")
      return 1
    try:
      tables = tune_tables.build_tables(
          paths, command=from_results_command(paths, ARCHITECTURE.value, MARGIN.value,
                                              ALLOW_UNSIGNED.value, STORE_ATOMICITY.value),
          architecture=ARCHITECTURE.value, margin=MARGIN.value,
          allow_unsigned=ALLOW_UNSIGNED.value, validated_by=STORE_ATOMICITY.value)
      write_tables(tables)
    except (tune_tables.TuningBuildError, OSError, ValueError) as e:
      # TuningBuildError: the result files (unreadable, not a regular file,
      # not JSON, too deeply nested, members of the wrong JSON type) or what
      # they measured; OSError: the tables' folder.
      print(f"jax_llar.tools.tune: --from_results: no table written: {e}")
      return 1
    return 0
  return measure()


if __name__ == "__main__":
  _cli.run(main)
