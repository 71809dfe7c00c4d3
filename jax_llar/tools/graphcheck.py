"""Shows whether XLA runs the jax_llar custom call inside a CUDA graph.

  python -m jax_llar.tools.graphcheck [--out DIR] [--xla_flag FLAG ...] [--timeline_copy]

Needs 2+ CUDA GPUs. Compiles and runs a jitted shard_map chain of jax_llar
psums and multiplies in a child process (so that XLA flags apply from
backend start), then looks for evidence in XLA's dump (the thunk sequence
after XLA's thunk passes, tied to the custom call through the thunk metadata
and the optimized HLO; or, with older XLA, the HLO's command_buffer
computations: is the custom call inside a command buffer?) and in a
profiler trace (did our kernel run from CUDA graphs while the host launched
no kernels itself?). The dump decides when it can, the trace otherwise; the
verdict's "evidence" says which, "evidence_agree" whether both agreed.

Prints the verdict as JSON; the exit status is 0 when the custom call was
captured into a command buffer, 1 otherwise. With fewer than two GPUs (a
psum over one rank is no all-reduce: jax_llar leaves it to lax.psum, so
there is no custom call to find) it says so in one line and exits with 1
before starting the child; so does a child that sees fewer than two.
"""

from __future__ import annotations

import json
import re
import tempfile

from absl import flags

from jax_llar.tools import _cli, capture, host, report

OUT = flags.DEFINE_string("out", None,
                          "Folder for the XLA dump and the profiler traces "
                          "(default: a new temporary folder).")
XLA_FLAG = flags.DEFINE_multi_string(
    "xla_flag", None,
    "An XLA flag (--xla_...) for the child process, e.g. "
    "--xla_flag=--xla_gpu_enable_command_buffer= (command buffers off)")
flags.register_validator(
    "xla_flag", lambda v: v is None or all(re.fullmatch(r"--xla_\w+(=\S*)?", f) for f in v),
    "--xla_flag must be one XLA flag, --xla_NAME or --xla_NAME=VALUE")
TIMELINE_COPY = flags.DEFINE_bool(
    "timeline_copy", False,
    "Also profile the same chain with the copy custom call in place of the psum "
    "and report its kernel timeline.")


def main() -> int:
  out = _cli.writable_folder(OUT.value) if OUT.value is not None else None
  gpus = host.gpu_count()
  if not gpus:
    print("jax_llar.tools.graphcheck needs CUDA GPUs (it checks how XLA runs the "
          "custom call on them); none is visible here.")
    return 1
  if gpus < 2:
    raise _cli.Refused(f"needs 2+ CUDA GPUs (a psum over one GPU is no all-reduce, so "
                       f"no custom call is compiled to look for); {gpus} visible here")
  out = out or tempfile.mkdtemp(prefix="llar_graphcheck_")
  xla_flags = tuple(XLA_FLAG.value or ())
  verdict = capture.check(out, xla_flags)
  child = verdict.get("child") or {}
  if isinstance(child.get("devices"), int) and child["devices"] < 2:
    raise _cli.Refused(f"needs 2+ CUDA GPUs; the child process saw {child['devices']} "
                       f"{child.get('platform', '')} device(s)".replace("  ", " "))
  if TIMELINE_COPY.value:
    copy = capture.check(out, xla_flags, impl="copy")
    verdict["copy_timeline"] = copy.get("trace", {}).get("timeline")
  verdict["git_commit"] = report.git_commit()
  verdict["out"] = out
  print(json.dumps(verdict, indent=1))
  return 0 if verdict["in_command_buffer"] else 1


if __name__ == "__main__":
  _cli.run(main)
