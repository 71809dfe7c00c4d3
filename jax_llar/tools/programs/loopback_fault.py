"""Child program of the loopback harness's fault mode: one case, one rank left out.

    python -m jax_llar.tools.programs.loopback_fault SPEC_JSON

SPEC_JSON is `jax_llar.tools.loopback.harness.fault_spec`'s object: the
case (world, dtype, n_bytes, start_epoch, calls, sync, generic, block_lines,
timeout_ms, misalign, sets, seed, device, signatures, signature_seed) and the
fault: "skip" (rank skip_rank's kernel left out of call skip_call; the other
ranks' bounded waits then time out and trap) or a signature fault on call
fault_call of rank fault_rank ("extra_call", "swap_signature": the ranks'
waits meet a line of another call's signature and trap at once). A trap
loses this process's CUDA context.

Prints one JSON line: ``{"unavailable"}`` (why the native tools module
cannot be loaded), ``{"skipped"}`` (why the case cannot run here: its
ranks' grids are not co-resident), or ``{"plan", "calls_launched",
"failed_call", "cuda_error", "deadline_exceeded", "seconds_to_error",
"records" (one per rank), "signatures" (each call's), "fault_signature"}``;
then exits at once, without the teardown that a lost context could hang.
"""

from __future__ import annotations

import json
import os
import sys


def main(argv: list[str]) -> int:
  if len(argv) != 2:
    print(__doc__, file=sys.stderr)
    return 2
  spec = json.loads(argv[1])
  import numpy as np

  from jax_llar.algorithms import Algorithm
  from jax_llar.tools import _native
  from jax_llar.tools.loopback import harness as lh

  try:
    mod = _native.require("the loopback fault child")
  except RuntimeError as e:
    print(json.dumps({"unavailable": str(e)}), flush=True)
    os._exit(0)  # pylint: disable=protected-access
  case = lh.Case(spec["world"], spec["dtype"], spec["n_bytes"], spec["start_epoch"])
  code = mod.DTYPE_CODES[str(case.np_dtype)]
  algorithm = int(Algorithm.from_short_name(spec.get("algorithm", "one_shot_ll")))
  plan = dict(mod.loopback_plan(case.world, case.n_bytes, code, calls=spec["calls"],
                                keep=1, n_sets=spec["sets"],
                                algorithm=algorithm,
                                generic=spec["generic"],
                                block_lines=spec["block_lines"], ordinal=spec["device"]))
  if not plan["co_resident"]:
    out = {"skipped": f"not co-resident: {case.world} x {plan['blocks']} blocks of "
                      f"{plan['threads']} threads on {plan['sms']} SMs x "
                      f"{plan['blocks_per_sm']}", "plan": plan}
  else:
    rng = np.random.default_rng(spec["seed"])
    inputs = lh.make_inputs(rng, case, spec["sets"], specials=False)
    r = mod.loopback(np.ascontiguousarray(inputs).view(np.uint8), code, spec["calls"],
                     sync=spec["sync"], keep=1,
                     algorithm=algorithm,
                     generic=spec["generic"],
                     block_lines=spec["block_lines"], timeout_ms=float(spec["timeout_ms"]),
                     start_epoch=spec["start_epoch"], misalign=spec["misalign"],
                     skip_rank=spec["skip_rank"], skip_call=spec["skip_call"],
                     ordinal=spec["device"], **lh.signature_kwargs(spec))
    out = {k: r[k] for k in ("calls_launched", "failed_call", "cuda_error",
                             "deadline_exceeded", "seconds_to_error", "max_connections")}
    out["signatures"] = [int(v) for v in r.get("signatures", [])]
    out["fault_signature"] = int(r.get("fault_signature", 0))
    out["plan"] = dict(r["plan"])
    out["records"] = [dict(x) for x in r["records"]]
  print(json.dumps(out, default=str), flush=True)
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(0)  # pylint: disable=protected-access


if __name__ == "__main__":
  sys.exit(main(sys.argv))
