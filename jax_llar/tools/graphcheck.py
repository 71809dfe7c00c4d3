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
captured into a command buffer, 1 otherwise.
"""

from __future__ import annotations

import json
import tempfile

from absl import flags

from jax_llar.tools import _cli, capture, host, report

OUT = flags.DEFINE_string("out", None,
                          "Folder for the XLA dump and the profiler traces "
                          "(default: a new temporary folder).")
XLA_FLAG = flags.DEFINE_multi_string(
    "xla_flag", None,
    "An XLA flag for the child process, e.g. --xla_flag=--xla_gpu_enable_command_buffer= "
    "(command buffers off)")
TIMELINE_COPY = flags.DEFINE_bool(
    "timeline_copy", False,
    "Also profile the same chain with the copy custom call in place of the psum "
    "and report its kernel timeline.")


def main() -> int:
  if not host.gpu_present():
    print("jax_llar.tools.graphcheck needs CUDA GPUs (it checks how XLA runs the "
          "custom call on them); none is visible here.")
    return 1
  out = OUT.value or tempfile.mkdtemp(prefix="llar_graphcheck_")
  xla_flags = tuple(XLA_FLAG.value or ())
  verdict = capture.check(out, xla_flags)
  if TIMELINE_COPY.value:
    copy = capture.check(out, xla_flags, impl="copy")
    verdict["copy_timeline"] = copy.get("trace", {}).get("timeline")
  verdict["git_commit"] = report.git_commit()
  verdict["out"] = out
  print(json.dumps(verdict, indent=1))
  return 0 if verdict["in_command_buffer"] else 1


if __name__ == "__main__":
  _cli.run(main)
