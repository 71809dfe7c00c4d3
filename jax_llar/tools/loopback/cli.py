"""Loopback harness: the all-reduce protocol at every world size, on one GPU.

  python -m jax_llar.tools.loopback [--worlds 2,3,4,5,8,16] [--dtypes float32,bfloat16]
      [--sizes 4,100,4096] [--calls 50] [--generic] [--no_sync] [--json out.json]
      [--algorithm two_shot_ll]   (the two-shot, sizes up to 4 MiB per rank)
      [--algorithm one_shot_sentinel --nan_patterns --bitwise_against one_shot_ll]
          (the sentinel one-shot, float dtypes, up to 512 KiB per rank; its
          outputs equal to the one-shot LL's bit for bit, NaNs included)
      [--algorithm two_shot_ll128_atomic]   (not deterministic: every rank's
          output the same bits, int32 exact, floats within the atomic-sum
          bound, jax_llar.testing.atomic_sum_violations, not bitwise)
  python -m jax_llar.tools.loopback --skip_rank R --skip_call C [...]   (fault mode)
  python -m jax_llar.tools.loopback --extra_call_rank R --fault_call C [...]
  python -m jax_llar.tools.loopback --swap_signature_rank R --fault_call C [...]
      (signature faults: a call paired with a call of another signature)
  python -m jax_llar.tools.loopback --op add_rms_norm [--shapes 1x4096,8x2048] [...]
      (the fused all-reduce + residual add + RMSNorm: jax_llar.tools.loopback.fused)
  python -m jax_llar.tools.loopback --op xla [--algorithm two_shot_ll] [...]
      (through a loopback group's FFI custom call inside jitted programs:
      jax_llar.tools.loopback.xla)

Needs one CUDA GPU and the CUDA extension. W ranks of one group are
simulated on that GPU: W scratch regions, W sets of epoch counters, error
records and peer tables (each table pointing at all W scratch regions on the
same device) and W launches of the production launcher per call, each rank
on a stream of its own so that the ranks' kernels run at once. Every kept
output of every rank is compared bitwise with the fast path's promise, a
float64 sum in rank order rounded once (NaNs by position), or for a
non-deterministic algorithm checked by its own rule (check_mode in
jax_llar.tools.loopback.harness), and every rank's epoch counters must have
advanced once per call.

What this tests: the protocol logic (LL lines and flags, per-warp epochs,
scratch parity over many consecutive calls, with --no_sync also ranks that
run calls ahead of each other, the re-zeroing window and the flags' epoch
wrap with --start_epochs, call signatures), the rank-order reduction, the kernels
specialised for 2, 4 and 8 ranks and the run-time-world one, for any world
size 2-16. What it does not test: NVLink. Every store is local to the one
GPU, so neither the ordering of remote stores over NVLink nor any speed is
exercised; the result files hold no timings for that reason.

Inputs are random; with --specials one input set of every case also carries
special values (-0.0, subnormals, inf, inf - inf, NaN payloads and
signalling NaNs, overflow, cancellation that only a float64 sum resolves,
rounding ties). Call c uses input set c modulo --sets.

All ranks' grids must be resident at once (a block spins until the same
block of every rank has sent): a case whose grids do not fit on the device
is skipped and says so. The tool sets CUDA_DEVICE_MAX_CONNECTIONS=32 (unless
set) before CUDA starts, so that each rank's stream gets a hardware queue of
its own.

Fault mode (--skip_rank R): in each case, rank R's kernel is never launched
on call --skip_call; every other rank must end in the bounded wait's error,
with a report naming itself as the rank that waited and R as the peer, at
that call's epoch, within its timeout, never a hang. Each case runs in a
child process, because the timed-out kernel traps and the CUDA context of
its process is lost.

Call signatures: every call carries one (a different one per call; the
signed algorithms, jax_llar.algorithms.SIGNED, put it in their flag words;
--nosignatures gives every call 0). Signature faults, for the signed
algorithms: --extra_call_rank R (rank R runs one extra call of another
signature before call --fault_call: the ranks are paired off by one, as after
a rank-dependent extra call) and --swap_signature_rank R (rank R's call
--fault_call carries another signature, as when two programs interleave
differently on its GPU). Every report must be the foreign-signature error
(code 2) naming both signatures, written before the timeout ran out, never a
wrong sum; child processes as in fault mode.

Results: a table on stdout and a JSON file (--json, else
OUT/<machine>-<yyyymmdd>-loopback<tag>.json, written atomically) with the
environment, the commit and one row per case. The exit status is 1 when a
case failed or none ran.

The command line is checked before anything runs (one line, status 1): the
settings (jax_llar.tools.loopback.harness.validate), the output file or
folder (writable), and, in every mode, that this machine has a GPU and the
CUDA extension with the native tools module, so that a fault mode does not
start its children to hear each say it cannot run.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from typing import Sequence

from absl import flags

from jax_llar import _ext
from jax_llar.tools import _cli, _native, host, report
from jax_llar.tools.loopback import fused as lf
from jax_llar.tools.loopback import harness as lh
from jax_llar.tools.loopback import xla as lx

WORLDS = flags.DEFINE_list("worlds", [str(w) for w in lh.DEFAULT_WORLDS],
                           "Simulated world sizes (ranks), 2-16.")
DTYPES_FLAG = flags.DEFINE_list("dtypes", list(lh.Settings.dtypes),
                                "Element types: float32, bfloat16, float16, int32 "
                                "(or f32, bf16, f16, i32).")
SIZES = flags.DEFINE_list("sizes", [str(n) for n in lh.DEFAULT_SIZES],
                          f"Payload sizes, bytes per rank, 1-{lh.MAX_BYTES} "
                          "(two_shot_ll: 1-"
                          f"{lh.max_bytes('two_shot_ll')}).")
ALGORITHM = flags.DEFINE_enum("algorithm", "one_shot_ll", list(lh.ALGORITHMS),
                              "--op all_reduce: the algorithm under test, through its "
                              "production launcher (--generic and --block_lines apply "
                              f"to {' and '.join(lh.ONE_SHOT_OPTIONS)} only; dtypes an "
                              "algorithm does not serve are skipped with the reason).")
NAN_PATTERNS = flags.DEFINE_bool("nan_patterns", False,
                                 "Put NaN bit patterns into input set 2 (needs --sets >= "
                                 "3): every float16 and bfloat16 NaN and a float32 sample "
                                 "in every position of a 16-byte line, and all-ones "
                                 "8-byte words beside their neighbours.")
BITWISE_AGAINST = flags.DEFINE_enum("bitwise_against", None, list(lh.ALGORITHMS),
                                    "Also run this algorithm on every case's inputs; both "
                                    "outputs must be equal byte for byte (NaN bits as "
                                    "--bitwise_nan says).")
BITWISE_NAN = flags.DEFINE_enum("bitwise_nan", "exact", ["exact", "position"],
                                "--bitwise_against: exact: NaN bits compared too; "
                                "position: where both outputs are NaN only counted "
                                "(nan_payload_differences).")
CANONICAL_NAN = flags.DEFINE_bool("canonical_nan", True,
                                  "Every NaN output must be the canonical NaN (float32 "
                                  "0x7fffffff, bfloat16 and float16 0x7fff), the rule of "
                                  "every algorithm (--nocanonical_nan: not checked).")
CALLS = flags.DEFINE_integer("calls", 50, "Consecutive all-reduce calls per case.",
                             lower_bound=1, upper_bound=10**8)
SETS = flags.DEFINE_integer("sets", 4, "Input sets; call c uses set c % sets.",
                            lower_bound=1, upper_bound=1024)
SPECIALS = flags.DEFINE_bool("specials", True,
                             "Put special values (signed zeros, subnormals, inf, NaN, "
                             "overflow, cancellation, ties) into one input set.")
GENERIC = flags.DEFINE_bool("generic", False,
                            "Run the run-time world-size kernel for every world size "
                            "(production runs it for other than 2, 4 and 8 ranks).")
NO_SYNC = flags.DEFINE_bool("no_sync", False,
                            "Do not synchronise the ranks between calls: each rank's "
                            "calls are ordered only by its own stream, so ranks run "
                            "calls ahead of each other (double buffering).")
BLOCK_LINES = flags.DEFINE_integer("block_lines", 0,
                                   "Grid rule's lines per block (0: production).",
                                   lower_bound=0, upper_bound=512)
TIMEOUT_MS = flags.DEFINE_integer("timeout_ms", 2000,
                                  "The kernels' bound on every wait, milliseconds.",
                                  lower_bound=1, upper_bound=600_000)
START_EPOCHS = flags.DEFINE_list(
    "start_epochs", ["0"],
    "Epoch counters start here; each case runs once per value. Values just below "
    "a multiple of 2^14 cross the re-zeroing window (epoch.cuh), of 2^16 the LL "
    "flags' epoch wrap, of 2^32 the LL128 flags' (e.g. 0,65530,4294967270: 2^32 - 26 "
    "crosses all three).")
MISALIGN = flags.DEFINE_integer("misalign", 0,
                                "Bytes added to every input and output address, 0-15 "
                                "(not a multiple of 8: the kernels' byte-wise path; 8: "
                                "the sentinel's, whose lines are 16 bytes).",
                                lower_bound=0, upper_bound=15)
KEEP = flags.DEFINE_integer("keep", 0,
                            "Check the outputs of the last KEEP calls (0: all), at "
                            "most --max_output_mib of them per case.", lower_bound=0,
                            upper_bound=10**8)
MAX_OUTPUT_MIB = flags.DEFINE_integer("max_output_mib", 256,
                                      "Bound on the outputs held per case, MiB.",
                                      lower_bound=1, upper_bound=1 << 20)
SEED = flags.DEFINE_integer("seed", 0, f"Seed of the random inputs {_cli.SEED_RANGE}.",
                            **_cli.SEED_BOUNDS)
DEVICE = flags.DEFINE_integer("device", 0, "CUDA ordinal to run on.", lower_bound=0,
                              upper_bound=63)
SKIP_RANK = flags.DEFINE_integer(
    "skip_rank", -1,
    "Fault mode: never launch this rank's kernel on call --skip_call; each case "
    "runs in a child process and must end in the bounded-wait error naming it.",
    lower_bound=-1, upper_bound=lh.MAX_RANKS - 1)
SKIP_CALL = flags.DEFINE_integer("skip_call", 3, "Fault mode: the call rank "
                                 "--skip_rank misses (0-based, below --calls).",
                                 lower_bound=0, upper_bound=10**8 - 1)
SIGNATURES = flags.DEFINE_bool("signatures", True,
                               "Every call carries a call signature (a different one "
                               "per call); --nosignatures: every call carries 0.")
SIGNATURE_SEED = flags.DEFINE_integer("signature_seed", 0,
                                      "The first call's signature minus one (0-65535).",
                                      lower_bound=0, upper_bound=65535)
EXTRA_CALL_RANK = flags.DEFINE_integer(
    "extra_call_rank", -1,
    "Signature fault: this rank runs one extra call of another signature before "
    "call --fault_call; each case runs in a child process and must end in the "
    "foreign-signature error.", lower_bound=-1, upper_bound=lh.MAX_RANKS - 1)
SWAP_SIGNATURE_RANK = flags.DEFINE_integer(
    "swap_signature_rank", -1,
    "Signature fault: this rank's call --fault_call carries another signature; "
    "each case runs in a child process and must end in the foreign-signature "
    "error.", lower_bound=-1, upper_bound=lh.MAX_RANKS - 1)
FAULT_CALL = flags.DEFINE_integer("fault_call", 3, "The call of a signature fault "
                                  "(0-based, below --calls).", lower_bound=0,
                                  upper_bound=10**8 - 1)
JOBS = flags.DEFINE_integer("jobs", 1, "Fault modes: child processes (cases) run at once, "
                            "each with a CUDA context of its own. Above 1 on one H200 the "
                            "trapping children made each other's bounded waits end tens "
                            "of seconds late (benchmarks/NOTES.md).",
                            lower_bound=1, upper_bound=32)
OP = flags.DEFINE_enum(
    "op", "all_reduce", ["all_reduce", "add_rms_norm", "xla"],
    "all_reduce: the one-shot all-reduce (the flags above). add_rms_norm: the fused "
    "all-reduce + residual add + RMSNorm (jax_llar.tools.loopback.fused) over "
    "--worlds, --dtypes, --shapes, --calls (each after a one-shot all-reduce of x), "
    "--start_epochs, --timeout_ms, --seed, --device; the other flags do not apply. "
    "xla: the cases of --algorithm over --worlds, --dtypes, --sizes through a loopback "
    "group inside jitted programs of --calls calls (jax_llar.tools.loopback.xla; with "
    "one_shot_ll also the fused op at --shapes), --timeout_ms, --seed, --device.")
SHAPES = flags.DEFINE_list(
    "shapes", [f"{r}x{d}" for r, d in lf.DEFAULT_SHAPES],
    "--op add_rms_norm: x's shapes per rank, ROWSxD (rows of d elements).")
flags.register_validator("shapes", bool, "--shapes must be one or more ROWSxD shapes")
JSON = flags.DEFINE_string("json", None, "Write the result to this file (default: "
                           "OUT/<machine>-<yyyymmdd>-loopback<tag>.json).")
OUT = flags.DEFINE_string("out", report.default_out_dir(), report.OUT_HELP)
TAG = flags.DEFINE_string("tag", "", f"Suffix of the result file name: {_cli.TAG_RULE}.")
_cli.register_tag_validator()


def _ints(values: Sequence[str], what: str) -> tuple[int, ...]:
  try:
    return tuple(int(v) for v in values)
  except ValueError:
    raise ValueError(f"--{what} must be integers: {','.join(values)}") from None


def settings_from_flags() -> lh.Settings:
  """The Settings the flags describe (not yet validated).

  Raises:
    ValueError: a list flag holds something other than integers.
  """
  return lh.Settings(
      worlds=_ints(WORLDS.value, "worlds"), dtypes=tuple(DTYPES_FLAG.value),
      sizes=_ints(SIZES.value, "sizes"), calls=CALLS.value, sets=SETS.value,
      specials=SPECIALS.value, generic=GENERIC.value, sync=not NO_SYNC.value,
      block_lines=BLOCK_LINES.value, timeout_ms=TIMEOUT_MS.value,
      start_epochs=_ints(START_EPOCHS.value, "start_epochs"), misalign=MISALIGN.value,
      keep=KEEP.value, max_output_bytes=MAX_OUTPUT_MIB.value << 20, seed=SEED.value,
      device=DEVICE.value, algorithm=ALGORITHM.value, nan_patterns=NAN_PATTERNS.value,
      bitwise_against=BITWISE_AGAINST.value, bitwise_nan=BITWISE_NAN.value,
      canonical_nan=CANONICAL_NAN.value, signatures=SIGNATURES.value,
      signature_seed=SIGNATURE_SEED.value)


def save(result: dict, json_path: str | None, out_dir: str, tag: str) -> str:
  """Writes `result` to `json_path`, or as a result file in `out_dir`, in
  both cases atomically; returns the path."""
  if json_path:
    os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
    report.write_json(json_path, result)
    return json_path
  return report.save(result, out_dir, report.stem("loopback", tag))[0]


def output_error() -> str | None:
  """Why the result cannot be written where --json or --out says (checked
  by creating the folder and a temporary file in it), or None."""
  try:
    if JSON.value is not None:
      _cli.writable_file(JSON.value, "json")
    else:
      _cli.writable_folder(OUT.value)
  except _cli.Refused as e:
    return str(e)
  return None


def gpu_error() -> str | None:
  """Why this machine cannot run the harness, found without starting CUDA
  (no GPU device, JAX_PLATFORMS without CUDA, the extension or the native
  tools module not built), or None when it may: checked once, before any
  case, in every mode (the fault modes' children would each fail)."""
  if not host.gpu_present():
    return "no NVIDIA GPU on this machine (or JAX_PLATFORMS excludes CUDA)"
  if not _ext.built():
    return "the CUDA extension jax_llar._llar is not built"
  if importlib.util.find_spec(_native.MODULE) is None:
    return f"the native tools module {_native.MODULE} is not built"
  visible = host.gpu_count()
  if DEVICE.value >= visible:
    return f"--device={DEVICE.value}, but {visible} GPU(s) are visible here"
  return None


def main() -> int:
  # Read by CUDA when it creates the context: before JAX starts its backends.
  os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", lh.MAX_CONNECTIONS)
  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  try:
    s = settings_from_flags()
    shapes = lf.parse_shapes(SHAPES.value)
  except ValueError as e:
    print(f"jax_llar.tools.loopback: {e}")
    return 1
  if OP.value == "add_rms_norm":
    return main_add_rms_norm(s, shapes)
  if OP.value == "xla":
    return main_xla(s, shapes)
  errors = lh.validate(s)
  if SKIP_RANK.value >= 0 and SKIP_CALL.value >= s.calls:
    errors.append("--skip_call must be below --calls")
  errors += lh.fault_errors(s, SKIP_RANK.value, EXTRA_CALL_RANK.value,
                            SWAP_SIGNATURE_RANK.value, FAULT_CALL.value)
  errors += [e for e in [output_error()] if e]
  if errors:
    print("jax_llar.tools.loopback: " + "; ".join(errors))
    return 1
  faulty = max(SKIP_RANK.value, EXTRA_CALL_RANK.value, SWAP_SIGNATURE_RANK.value) >= 0
  missing = gpu_error()
  if missing:
    print(f"jax_llar.tools.loopback needs one CUDA GPU and the CUDA extension: {missing}")
    return 1
  # In fault mode only the children start CUDA; they say when they cannot.
  if not faulty and _native.load() is None:
    print(f"jax_llar.tools.loopback needs one CUDA GPU and the CUDA extension: "
          f"{_native.reason()}")
    return 1
  print(lh.NOTE, flush=True)
  result = lh.run(s, SKIP_RANK.value, SKIP_CALL.value,
                  extra_call_rank=EXTRA_CALL_RANK.value,
                  swap_signature_rank=SWAP_SIGNATURE_RANK.value, fault_call=FAULT_CALL.value,
                  jobs=JOBS.value)
  path = save(result, JSON.value, OUT.value, TAG.value)
  counts = lh.summary(result["rows"])
  print("cases: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
  connections = {r.get("max_connections") for r in result["rows"]} - {None}
  if connections and any(int(c) < max(s.worlds) for c in connections if c.isdigit()):
    print(f"note: CUDA_DEVICE_MAX_CONNECTIONS={','.join(sorted(connections))} is below "
          "the largest world size: some ranks' streams shared a hardware queue")
  print(f"saved {path}")
  ran = counts.get("pass", 0) + counts.get("fail", 0) + counts.get("error", 0)
  bad = counts.get("fail", 0) + counts.get("error", 0) + counts.get("not_run", 0)
  return 1 if bad or not ran else 0


def main_add_rms_norm(s: lh.Settings, shapes) -> int:
  """--op add_rms_norm: the fused kernel's cases (jax_llar.tools.loopback.fused)."""
  if not DTYPES_FLAG.present:  # int32 is not the fused op's
    s = dataclasses.replace(s, dtypes=("float32", "bfloat16", "float16"))
  errors = [e for e in lh.validate(s) if not e.startswith("sizes")]
  return _run_mode(errors, lf.NOTE, "-add_rms_norm", lambda: lf.run(
      s.worlds, s.dtypes, shapes, s.calls, s.timeout_ms, s.start_epochs, s.seed, s.device))


def _run_mode(errors: list[str], note: str, default_tag: str, run) -> int:
  """The rest of an --op mode other than all_reduce, given the errors its
  own flag checks found: the checks every such mode shares (no fault flag,
  a writable result), then the native module, `run()`, the result saved,
  the cases counted. Exit status 1 when a flag is refused, or a case
  failed, erred or did not run, or none ran."""
  errors = list(errors)
  if max(SKIP_RANK.value, EXTRA_CALL_RANK.value, SWAP_SIGNATURE_RANK.value) >= 0:
    errors.append("--skip_rank, --extra_call_rank and --swap_signature_rank apply to "
                  "--op all_reduce only")
  errors += [e for e in [output_error()] if e]
  if errors:
    print("jax_llar.tools.loopback: " + "; ".join(errors))
    return 1
  if _native.load() is None:
    print(f"jax_llar.tools.loopback needs one CUDA GPU and the CUDA extension: "
          f"{_native.reason()}")
    return 1
  print(note, flush=True)
  result = run()
  path = save(result, JSON.value, OUT.value, TAG.value or default_tag)
  counts = lh.summary(result["rows"])
  print("cases: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
  print(f"saved {path}")
  ran = counts.get("pass", 0) + counts.get("fail", 0) + counts.get("error", 0)
  bad = counts.get("fail", 0) + counts.get("error", 0) + counts.get("not_run", 0)
  return 1 if bad or not ran else 0


def main_xla(s: lh.Settings, shapes) -> int:
  """--op xla: cases through a loopback group inside jitted programs
  (jax_llar.tools.loopback.xla)."""
  errors = [e for e in lh.validate(s) if not e.startswith("start_epochs")]
  if s.algorithm == "nccl_lla2a_one_shot":
    errors.append("nccl_lla2a_one_shot needs NCCL's device communicator; a loopback "
                  "group makes no NCCL call")
  return _run_mode(errors, lx.NOTE, "-xla", lambda: lx.run(
      s.algorithm, s.worlds, s.dtypes, s.sizes, shapes, s.calls, s.timeout_ms, s.seed,
      s.device))


if __name__ == "__main__":
  _cli.run(main)
