"""Benchmarks of jax_llar against lax.psum and XLA's own cost per call.

  python -m jax_llar.tools.bench --level jax      jitted chains, microseconds per step
  python -m jax_llar.tools.bench --level loop     the same step in each loop structure
  python -m jax_llar.tools.bench --level kernel   the kernels alone, microseconds per call

JAX level: a jitted shard_map chain of K steps x = op(x) * f[rank] per
implementation (lax.psum, ffi.copy: a copy kernel behind the same FFI path as
jax_llar, llar.one_shot_ll: jax_llar.psum); the per-step time is the slope
between chain lengths --k_short and --k_long. Without a GPU it runs on 2
forced CPU devices, where jax_llar falls back to lax.psum (rows marked '*').

Loop level: the step x = op(x) * f[rank] in each loop structure a user
writes (a Python-unrolled chain, lax.scan with unroll 1 and 8, fori_loop of
one and of 8 steps per trip, while_loop on a counter, a while_loop whose
predicate all-reduces a scalar, a Python loop over a jitted step), per
implementation (lax.psum, llar.auto: jax_llar.psum, ffi.copy, none: no
collective); per-step slope between --k_short and --k_long steps, and the
ratio to the same implementation's chain. Its defaults differ from the jax
level's where a flag is not given: sizes 1024,16384, dtype bf16, 32 and 256
steps, 60 calls. --loop_flags repeats it under XLA flag sets, one process
each.

Kernel level (needs 2+ CUDA GPUs and the CUDA extension): --kernel_iters
back-to-back calls of each kernel in one CUDA graph per rank, all ranks
launched together; per call, the maximum over ranks.

Every row is checked bitwise against a reference on random data before it
is timed (the table says which reference each matched): jax_llar and the
copy call against the rank order, lax.psum against its own one-step sums
(jax_llar.tools.bench.jax_level); the exit status is 1 when a row's result equals
none of its references. Without a GPU the copy call lowers to nothing, so
its rows measure the multiplies alone. Results go to
OUT/<machine>-<yyyymmdd>-<level><tag>.json (and .png with matplotlib; a
second run of the same name gets a -2, -3, ... suffix), written atomically.

The command line is checked before any work, and a run refused in one line
with exit status 1: every size must be 1 B to 256 MiB per rank and a whole
number of elements of every dtype asked for (3 B of float32 is refused, not
rounded); --world 0 (every device) or 2-16, and no more than the devices
present (on CPU the forced device count follows --world); the output folder
must be creatable and writable (it is created, and a temporary file written
in it); --tag a file-name part; the levels that need GPUs say so when there
are too few.
The method: benchmarks/METHOD.md in the repository.
"""

from __future__ import annotations

from absl import flags

import re

from jax_llar.algorithms import MAX_RANKS
from jax_llar.tools import _cli, _native, host, report
from jax_llar.tools.bench import jax_level as jax_level
from jax_llar.tools.bench import kernel_level as kernel_level
from jax_llar.tools.bench import loop_level as loop_level

_ALL_IMPLS = jax_level.IMPLS + jax_level.DIAG_IMPLS
PROG = "jax_llar.tools.bench"
# Bounds of the integer flags (a run beyond them is not a benchmark anyone
# waits for; the chains' and timing bounds are jax_level's).
MAX_STEPS = jax_level.MAX_STEPS
MAX_CALLS = jax_level.MAX_CALLS
MAX_ROUNDS = jax_level.MAX_ROUNDS
MAX_KERNEL_ITERS = 100_000
MAX_FLAG_TIMEOUT_S = 86_400

LEVEL = flags.DEFINE_enum("level", "jax", ["jax", "loop", "kernel"],
                          "jax: jitted shard_map chains (slope method); loop: the "
                          "same step in each loop structure; kernel: CUDA graphs of "
                          "back-to-back kernel calls, without XLA.")
SIZES = flags.DEFINE_list("sizes", [str(s) for s in jax_level.DEFAULT_SIZES],
                          f"Payload sizes, bytes per rank: 1 to {jax_level.MAX_SIZE} "
                          "(256 MiB), each a whole number of elements of every dtype.")
DTYPES = flags.DEFINE_list("dtypes", ["f32", "bf16"],
                           "Element types: f32, bf16, f16 (or float32, bfloat16, float16).")
IMPLS = flags.DEFINE_list(
    "impls", None,
    f"Implementations to run (default: all of the level's). Jax level: "
    f"{', '.join(jax_level.IMPLS)}, and the diagnostic {', '.join(jax_level.DIAG_IMPLS)}. "
    f"Loop level: {', '.join(loop_level.IMPLS)}. "
    f"Kernel level: {', '.join(kernel_level.KERNEL_IMPLS)}.")
STRUCTURES = flags.DEFINE_list(
    "structures", list(loop_level.STRUCTURES),
    "Loop structures to run (loop level).")
K_SHORT = flags.DEFINE_integer("k_short", 32, "Short chain length, steps (jax level).",
                               lower_bound=1, upper_bound=MAX_STEPS - 1)
K_LONG = flags.DEFINE_integer("k_long", 512, "Long chain length, steps (jax level).",
                              lower_bound=2, upper_bound=MAX_STEPS)
CALLS = flags.DEFINE_integer("calls", 120,
                             "Timed calls per chain length and implementation (jax level).",
                             lower_bound=1, upper_bound=MAX_CALLS)
ROUNDS = flags.DEFINE_integer("rounds", 6,
                              "Interleaved timing rounds (jax level) or graph replays "
                              "(kernel level).", lower_bound=1, upper_bound=MAX_ROUNDS)
KERNEL_ITERS = flags.DEFINE_integer("kernel_iters", 1000,
                                    "Calls captured per CUDA graph (kernel level; NCCL "
                                    f"uses {kernel_level.NCCL_ITERS}).", lower_bound=1,
                                    upper_bound=MAX_KERNEL_ITERS)
WORLD = flags.DEFINE_integer("world", 0, f"Devices to use: 0 (all) or 2-{MAX_RANKS}, at "
                             "most the devices present.", lower_bound=0,
                             upper_bound=MAX_RANKS)
SEED = flags.DEFINE_integer("seed", 0, f"Seed of the random inputs {_cli.SEED_RANGE}.",
                            **_cli.SEED_BOUNDS)
TIMELINE_MAX_BYTES = flags.DEFINE_integer(
    "timeline_max_bytes", 4096,
    "On GPUs, also read the per-step device period from a profiler trace at "
    "sizes up to this many bytes per rank (jax level; not for lax.psum).", lower_bound=0,
    upper_bound=jax_level.MAX_SIZE)
ANATOMY_BYTES = flags.DEFINE_integer(
    "anatomy_bytes", 0,
    "On GPUs, also split the wall time of a call into host time before the "
    "first all-reduce kernel, device time and host time after, from the "
    "kernels' call trace, at this size per rank (jax level; 0: off).", lower_bound=0,
    upper_bound=jax_level.MAX_SIZE)
PSUM_FLAGS = flags.DEFINE_bool(
    "psum_flags", False,
    "Also time lax.psum under XLA flags that target small all-reduces, each "
    "flag in its own subprocess (jax level). The flags: " +
    "; ".join(jax_level.PSUM_FLAGS) + " (or those given with --psum_flag).")
PSUM_FLAG = flags.DEFINE_multi_string(
    "psum_flag", None,
    "An XLA flag (--xla_...) for --psum_flags in place of the default set")
LOOP_FLAGS = flags.DEFINE_bool(
    "loop_flags", False,
    "Also run the loop level under each XLA flag set, each in its own "
    "subprocess: " + "; ".join(f"{n}: {f or '(none added)'}"
                               for n, f in loop_level.FLAG_SETS) +
    " (or those named with --loop_flag_set).")
LOOP_FLAG_SET = flags.DEFINE_multi_enum(
    "loop_flag_set", None, list(loop_level.FLAG_SET_NAMES),
    "A flag set for --loop_flags in place of all of them.")
FLAG_TIMEOUT = flags.DEFINE_integer("flag_timeout", 600,
                                    "Seconds allowed per --psum_flags or --loop_flags "
                                    "subprocess.", lower_bound=1,
                                    upper_bound=MAX_FLAG_TIMEOUT_S)
OUT = flags.DEFINE_string(
    "out", report.default_out_dir(),
    report.OUT_HELP)
TAG = flags.DEFINE_string("tag", "", f"Suffix of the result file names: {_cli.TAG_RULE}.")

_cli.register_int_list_validator("sizes", 1, jax_level.MAX_SIZE, "sizes in bytes per rank")
_cli.register_choices_validator(
    "dtypes", list(jax_level.DTYPES),
    what="f32, bf16 or f16 (or float32, bfloat16, float16)")
_cli.register_tag_validator()
flags.register_validator(
    "psum_flag", lambda v: v is None or all(re.fullmatch(r"--xla_\w+(=\S*)?", f) for f in v),
    "--psum_flag must be one XLA flag, --xla_NAME or --xla_NAME=VALUE")


@flags.multi_flags_validator(
    ["level", "impls"],
    message="--impls must name one or more of the level's implementations (--help lists them)")
def _impls_known(v) -> bool:
  known = {"jax": _ALL_IMPLS, "loop": loop_level.IMPLS}.get(
      v["level"], tuple(kernel_level.KERNEL_IMPLS))
  return v["impls"] is None or (bool(v["impls"]) and all(i in known for i in v["impls"]))


flags.register_validator(
    "world", lambda v: v != 1,
    f"--world must be 0 (every device) or 2-{MAX_RANKS}: an all-reduce needs 2+ devices")


@flags.multi_flags_validator(["level", "sizes", "dtypes"],
                             message="--sizes must be whole numbers of elements of every "
                                     "dtype (2 bytes for bf16 and f16, 4 for f32): no size "
                                     "is rounded")
def _whole_elements(v) -> bool:
  dtypes = v["dtypes"]
  if v["level"] == "loop" and not flags.FLAGS["dtypes"].present:
    dtypes = loop_level.DEFAULT_DTYPES
  try:
    sizes = [int(x) for x in v["sizes"]]
    widths = [jax_level.DTYPES[d].itemsize for d in dtypes]
  except (KeyError, ValueError, TypeError):
    return True  # refused by the flags' own validators
  return all(n % w == 0 for n in sizes for w in widths)


@flags.multi_flags_validator(["k_short", "k_long"],
                             message="--k_long must be larger than --k_short")
def _chain_lengths(v) -> bool:
  return v["k_long"] > v["k_short"]


flags.register_validator(
    "structures", lambda v: bool(v) and all(x in loop_level.STRUCTURES for x in v),
    "--structures must name " + ", ".join(loop_level.STRUCTURES))


@flags.multi_flags_validator(
    ["level", "k_short", "k_long"],
    message=f"the loop level needs --k_short and --k_long that are multiples of "
            f"{loop_level.UNROLL}")
def _loop_step_counts(v) -> bool:
  return v["level"] != "loop" or (v["k_short"] % loop_level.UNROLL == 0 and
                                  v["k_long"] % loop_level.UNROLL == 0)


def _given(flag, default):
  """The flag's value when given on the command line, else `default`."""
  return flag.value if flags.FLAGS[flag.name].present else default


def _loop_settings() -> loop_level.Settings:
  flag_sets = ()
  if LOOP_FLAGS.value:
    flag_sets = tuple(LOOP_FLAG_SET.value or loop_level.FLAG_SET_NAMES)
  return loop_level.Settings(
      impls=tuple(IMPLS.value or loop_level.IMPLS), structures=tuple(STRUCTURES.value),
      sizes=tuple(int(s) for s in _given(SIZES, loop_level.DEFAULT_SIZES)),
      dtypes=tuple(_given(DTYPES, loop_level.DEFAULT_DTYPES)),
      k_short=_given(K_SHORT, loop_level.DEFAULT_K_SHORT),
      k_long=_given(K_LONG, loop_level.DEFAULT_K_LONG),
      calls=_given(CALLS, loop_level.DEFAULT_CALLS),
      rounds=_given(ROUNDS, loop_level.DEFAULT_ROUNDS), world=WORLD.value,
      seed=SEED.value, flag_sets=flag_sets, flag_timeout_s=FLAG_TIMEOUT.value)


def _check_copy_call(impls) -> None:
  """On GPUs the copy calls (ffi.copy, diag.ffi_copy_wide) are the native
  tools module's kernels: refuses the run before any measurement when the
  module cannot be loaded (its lowering would fail midway, after the rows
  before it were measured).

  Raises:
    _cli.Refused: naming the copy impls and the reason.
  """
  import jax
  copies = [i for i in impls if i in jax_level.COPY_IMPLS]
  if copies and jax.devices()[0].platform == "gpu" and _native.load() is None:
    raise _cli.Refused(f"{', '.join(copies)} on GPUs needs the native tools module: "
                       f"{_native.reason()} (--impls without {', '.join(copies)} runs "
                       "the others)")


def main() -> int:
  level = LEVEL.value
  if level == "loop":
    settings = _loop_settings()
    sizes, dtypes = settings.sizes, settings.dtypes
  else:
    sizes, dtypes = tuple(int(s) for s in SIZES.value), tuple(DTYPES.value)
  errors = jax_level.settings_errors(sizes, dtypes, WORLD.value, MAX_RANKS)
  if errors:  # the flags' validators refuse these first: a backstop
    raise _cli.Refused("; ".join(errors))
  if level == "loop" and settings.k_long <= settings.k_short:
    raise _cli.Refused("--k_long must be larger than --k_short")
  out_dir = _cli.writable_folder(OUT.value)
  if level in ("jax", "loop") and not host.gpu_present():
    changed = host.use_cpu(max(2, WORLD.value))
    if changed:
      print(f"{PROG}: no GPU here; running on forced CPU devices ("
            + ", ".join(changed) + ")", flush=True)
  if level == "kernel":
    if _native.load() is None:
      raise _cli.Refused(f"the kernel level needs 2+ CUDA GPUs and the CUDA "
                         f"extension: {_native.reason()}")
    host.devices_for("the kernel level", WORLD.value, cuda=True)
    result = kernel_level.run(kernel_level.Settings(
        impls=tuple(IMPLS.value or kernel_level.KERNEL_IMPLS), sizes=sizes, dtypes=dtypes,
        iters=KERNEL_ITERS.value, reps=ROUNDS.value, world=WORLD.value, seed=SEED.value))
  elif level == "loop":
    host.devices_for("the loop level", WORLD.value)
    _check_copy_call(settings.impls)
    result = loop_level.run(settings)
  else:
    host.devices_for("the JAX level", WORLD.value)
    _check_copy_call(IMPLS.value or jax_level.IMPLS)
    mod = _native.load() if ANATOMY_BYTES.value and host.gpu_present() else None
    if mod is not None and K_LONG.value > mod.TRACE_SLOTS:
      raise _cli.Refused(f"--anatomy_bytes needs --k_long <= {mod.TRACE_SLOTS} (the call "
                         "trace's slots)")
    result = jax_level.run(jax_level.Settings(
        impls=tuple(IMPLS.value or jax_level.IMPLS), sizes=sizes, dtypes=dtypes,
        k_short=K_SHORT.value, k_long=K_LONG.value, calls=CALLS.value,
        rounds=ROUNDS.value, world=WORLD.value, seed=SEED.value,
        timeline_max_bytes=TIMELINE_MAX_BYTES.value, anatomy_bytes=ANATOMY_BYTES.value,
        psum_flags=tuple(PSUM_FLAG.value or jax_level.PSUM_FLAGS) if PSUM_FLAGS.value else (),
        flag_timeout_s=FLAG_TIMEOUT.value))
  paths = report.save(result, out_dir, report.stem(level, TAG.value),
                      plot_title=report.machine_name(),
                      plotter=loop_level.plot_loop if level == "loop" else None)
  if level == "jax":
    report.print_jax_table(result["rows"])
  elif level == "loop":
    loop_level.print_loop_table(result["rows"], result.get("flag_sets", {}))
  print(f"saved {', '.join(paths)}")
  bad = [r for r in result["rows"] if not r["correct"]]
  if bad:
    print(f"{len(bad)} row(s) matched no reference: "
          + ", ".join(f"{r['impl']} {r.get('structure', '')} {r['dtype']} "
                      f"{r['bytes_per_rank']} B".replace("  ", " ") for r in bad[:10]))
  return 1 if bad else 0


if __name__ == "__main__":
  _cli.run(main)
