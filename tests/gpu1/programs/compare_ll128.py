"""Child program: an LL128 algorithm against its LL twin on the same inputs.

    python tests/gpu1/programs/compare_ll128.py SPEC_JSON

SPEC_JSON: {"cases": [[world, dtype, n_bytes, misalign, start_epoch], ...],
"calls": int, "sync": bool, "seed": int, "algorithms": [reference, tested]
(short names; default ["one_shot_ll", "one_shot_ll128"])}. Each case runs on
the loopback harness (every rank simulated on one GPU) twice with the same
input sets, once per algorithm, `calls` calls each, every call's output
kept. A row says whether the two outputs are equal bit for bit, NaNs by
position (equal), whether they are the same bytes, NaN bits too (same_bytes),
whether the tested algorithm's outputs match the float64 rank-order
reference (reference; NaNs by position, as the loopback tool checks) and
whether both runs ended clean (epoch counters advanced once per call, no
error record, no CUDA error).

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
  from jax_llar.tools.loopback import harness as lh

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
    names = spec.get("algorithms", ["one_shot_ll", "one_shot_ll128"])
    algos = {"ll": int(Algorithm.from_short_name(names[0])),
             "ll128": int(Algorithm.from_short_name(names[1]))}
    row["algorithms"] = names
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
    # Bitwise with NaNs by position (lh.bitwise_difference): which NaN a
    # float sum of NaN payloads yields depends on the operand order each
    # compiled addition has, not only on the inputs (benchmarks/NOTES.md,
    # the sentinel's entry), so equal NaN bits are recorded, not required.
    a = outs["ll"].view(case.np_dtype)
    b = outs["ll128"].view(case.np_dtype)
    diff = lh.bitwise_difference(b, a, 0, inputs, nan="position")
    row["equal"] = diff is None
    if diff is not None:
      row["difference"] = diff
    row["same_bytes"] = bool(np.array_equal(outs["ll"], outs["ll128"]))
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
