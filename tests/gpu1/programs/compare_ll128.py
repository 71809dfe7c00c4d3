"""Child program: the one-shot LL128 against the one-shot LL on the same inputs.

    python tests/gpu1/programs/compare_ll128.py SPEC_JSON

SPEC_JSON: {"cases": [[world, dtype, n_bytes, misalign, start_epoch], ...],
"calls": int, "sync": bool, "seed": int}. Each case runs on the loopback
harness (every rank simulated on one GPU) twice with the same input sets,
once per algorithm, `calls` calls each, every call's output kept. A row
says whether the two outputs are the same bytes (equal), whether the
LL128's outputs match the float64 rank-order reference (reference; NaNs by
position, as the loopback tool checks) and whether both runs ended clean
(epoch counters advanced once per call, no error record, no CUDA error).

Prints one JSON line: {"rows": [...]} or {"unavailable": why}; cases whose
ranks' grids are not co-resident for either algorithm come back with
status "skipped". Runs in a child process because a failed case may lose
the CUDA context; set CUDA_DEVICE_MAX_CONNECTIONS before starting it.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np


def main(argv: list[str]) -> int:
  if len(argv) != 2:
    print(__doc__, file=sys.stderr)
    return 2
  spec = json.loads(argv[1])
  from jax_llar.algorithms import Algorithm
  from jax_llar.tools import _native
  from jax_llar.tools import loopback_harness as lh

  try:
    mod = _native.require("the LL128 comparison child")
  except RuntimeError as e:
    print(json.dumps({"unavailable": str(e)}), flush=True)
    return 0
  rng = np.random.default_rng(spec["seed"])
  calls, sync = spec["calls"], spec["sync"]
  rows = []
  for world, dtype, n_bytes, misalign, start_epoch in spec["cases"]:
    case = lh.Case(world, dtype, n_bytes, start_epoch)
    row = {"world_size": world, "dtype": dtype, "bytes_per_rank": n_bytes,
           "misalign": misalign, "start_epoch": start_epoch, "calls": calls,
           "sync": sync, "status": "fail"}
    code = mod.DTYPE_CODES[str(case.np_dtype)]
    algos = {"ll": int(Algorithm.ONE_SHOT_LL), "ll128": int(Algorithm.ONE_SHOT_LL128)}
    plans = {k: dict(mod.loopback_plan(world, n_bytes, code, calls=calls, keep=calls,
                                       n_sets=4, algorithm=a))
             for k, a in algos.items()}
    row["plan_ll128"] = plans["ll128"]
    if not all(p["co_resident"] for p in plans.values()):
      row["status"] = "skipped"
      row["reason"] = "not co-resident"
      rows.append(row)
      continue
    inputs = lh.make_inputs(rng, case, 4, specials=True)
    raw = np.ascontiguousarray(inputs).view(np.uint8)
    outs = {}
    problems = []
    for k, a in algos.items():
      r = mod.loopback(raw, code, calls, sync=sync, keep=calls, algorithm=a,
                       timeout_ms=2000.0, start_epoch=start_epoch, misalign=misalign)
      if r["cuda_error"] is not None:
        problems.append(f"{k}: {r['cuda_error']}")
      elif not r["epochs_checked"] or r["epoch_mismatch"] is not None:
        problems.append(f"{k}: epochs {r['epoch_mismatch']}")
      if any(x["code"] for x in r["records"]):
        problems.append(f"{k}: error records")
      outs[k] = np.asarray(r["outputs"])
    if problems:
      row["problems"] = problems
      rows.append(row)
      if any("cuda" in p.lower() for p in problems):
        break  # the context may be lost
      continue
    row["equal"] = bool(outs["ll"].shape == outs["ll128"].shape and
                        np.array_equal(outs["ll"], outs["ll128"]))
    if not row["equal"] and outs["ll"].shape == outs["ll128"].shape:
      diff = np.argwhere(outs["ll"] != outs["ll128"])
      row["different_bytes"] = int(len(diff))
      row["first_different_byte"] = [int(v) for v in diff[0]]  # (call, rank, byte)
    got = outs["ll128"].view(case.np_dtype)
    mismatch = lh.first_mismatch(got, lh.references(inputs), 0, inputs)
    row["reference"] = mismatch is None
    if mismatch is not None:
      row["first_mismatch"] = mismatch
    row["status"] = "pass" if row["equal"] and row["reference"] else "fail"
    rows.append(row)
  print(json.dumps({"rows": rows}, default=str), flush=True)
  sys.stdout.flush()
  os._exit(0)  # pylint: disable=protected-access


if __name__ == "__main__":
  sys.exit(main(sys.argv))
