"""The one-shot LL128 all-reduce on the loopback harness (one GPU, every rank
simulated on it): ``python -m jax_llar.tools.loopback
--algorithm=one_shot_ll128`` and a child program that runs the one-shot LL
and the LL128 on the same inputs.

World sizes 2-16 (the kernels for 2, 4 and 8 ranks and the run-time one),
every dtype, sizes of one element, odd sizes, sizes one element below, at
and above multiples of the 120-byte line (the first line, a block's lines,
the one-shot LL's limit), the LL128's limit, 8-byte misaligned buffers,
consecutive calls with and without synchronising the ranks, from epoch 0,
across the re-zeroing window (every 2^14 epochs) and across the flag word's
32-bit epoch wrap (a rank left out of a call: test_faults_loopback.py).
What passes here is the
protocol logic and the reduction on one GPU's L2, not NVLink: every store is
local (tests/gpu/test_ll128.py is the 2-GPU suite).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

from jax_llar.tools.loopback_harness import MAX_CONNECTIONS

from loopback_helpers import ROOT, run_tool, statuses

LL128 = "--algorithm=one_shot_ll128"
LIMIT = 64 * 64 * 120  # kOneShotLL128MaxBytes
COMPARE = pathlib.Path(__file__).parent / "programs" / "compare_ll128.py"


def _problems(record):
  """Rows that neither passed nor were skipped for a reason the harness
  states (not a whole number of elements; grids not co-resident)."""
  bad = []
  for r in record["rows"]:
    if r["status"] == "pass":
      continue
    reason = r.get("reason", "")
    if r["status"] == "skipped" and ("whole number" in reason or "co-resident" in reason):
      continue
    bad.append(r)
  return bad


def _passed(record):
  return {(r["world_size"], r["dtype"], r["bytes_per_rank"], r["start_epoch"])
          for r in record["rows"] if r["status"] == "pass"}


def test_ll128_every_world_size_synchronised(tmp_path):
  """Worlds 2, 3, 4, 5, 8, 16, every dtype, 20 calls, from epoch 0 and
  from 2^32 - 16: across the re-zeroing window and the flag word's 32-bit
  epoch wrap (and the LL flags' 16-bit one) within the 20 calls; one element,
  odd sizes, one element either side of a line and of 35 lines, beyond the
  one-shot LL's limit and at the LL128's."""
  sizes = "4,6,116,118,120,122,124,4196,4200,4204,98304,491520"
  rc, record, tail = run_tool(tmp_path, LL128, "--worlds=2,3,4,5,8,16",
                              "--dtypes=float32,bfloat16,float16,int32",
                              f"--sizes={sizes}", "--calls=20",
                              "--start_epochs=0,4294967280")
  assert record is not None, tail
  assert rc == 0 and not _problems(record), tail
  passed = _passed(record)
  for world in (2, 3, 4, 5, 8):
    for e in (0, 4294967280):
      for n in (4, 116, 120, 124, 4196, 4200, 4204, 98304):
        for dtype in ("float32", "int32", "bfloat16", "float16"):
          assert (world, dtype, n, e) in passed, (world, dtype, n, e, tail)
      for n in (6, 118, 122):
        for dtype in ("bfloat16", "float16"):
          assert (world, dtype, n, e) in passed, (world, dtype, n, e, tail)
  assert (2, "float32", 491520, 0) in passed, tail
  assert {(16, "bfloat16", n, 0) for n in (4, 6, 118, 120, 122, 4200)} <= passed, tail
  assert all(r["impl"] == "loopback.one_shot_ll128" for r in record["rows"])
  kernels = {(r["world_size"], r["kernel"]) for r in record["rows"] if r["status"] == "pass"}
  assert {(2, "world 2"), (4, "world 4"), (8, "world 8"), (3, "generic"),
          (16, "generic")} <= kernels
  assert "not NVLink" in record["note"]


def test_ll128_ranks_running_ahead_misaligned_rezeroing(tmp_path):
  """No synchronisation between calls (ranks run calls ahead, both halves in
  use at once), buffers 3 bytes off 8-byte alignment (the byte-wise path),
  50 calls across the re-zeroing window."""
  rc, record, tail = run_tool(tmp_path, LL128, "--worlds=2,3,8,16", "--dtypes=float32,bfloat16",
                              "--sizes=100,4200,65540", "--calls=50", "--no_sync",
                              "--misalign=3", "--start_epochs=0,1073741800")
  assert record is not None, tail
  assert rc == 0 and not _problems(record), tail
  passed = _passed(record)
  for world in (2, 3, 8, 16):
    for n in (100, 4200, 65540):
      for e in (0, 1073741800):
        assert (world, "float32", n, e) in passed, (world, n, e, tail)


def _compare(cases, calls, sync, seed=0, timeout=900,
             algorithms=("one_shot_ll", "one_shot_ll128")):
  """Runs the comparison child program (programs/compare_ll128.py); returns
  its rows and the tail of its output."""
  env = dict(os.environ)
  env.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", MAX_CONNECTIONS)
  spec = {"cases": cases, "calls": calls, "sync": sync, "seed": seed,
          "algorithms": list(algorithms)}
  p = subprocess.run([sys.executable, str(COMPARE), json.dumps(spec)], cwd=ROOT,
                     capture_output=True, text=True, timeout=timeout, env=env)
  tail = (p.stdout + p.stderr)[-4000:]
  line = next((ln for ln in reversed(p.stdout.splitlines()) if ln.startswith("{")), None)
  assert line is not None, tail
  data = json.loads(line)
  assert "unavailable" not in data, data
  return data["rows"], tail


def test_ll128_output_is_bitwise_the_one_shot_lls():
  """Same input sets (random, with special values: signed zeros, subnormals,
  inf, NaN payloads, overflow, cancellation, ties) through the one-shot LL
  and the LL128: every output bit of every call and rank is equal (NaNs by
  position: which NaN a sum of NaN payloads gives depends on the compiled
  operand order), and the LL128's match the float64 rank-order reference;
  line-boundary sizes, aligned and misaligned, synchronised and not."""
  itemsize = {"float32": 4, "bfloat16": 2, "float16": 2, "int32": 4}
  cases = []
  for world in (2, 3, 4, 8, 16):
    for dtype, s in itemsize.items():
      sizes = {s, 3 * s}
      for k in (1, 33, 2184):  # 2184 lines: just below the one-shot LL's limit
        sizes |= {120 * k - s, 120 * k, 120 * k + s}
      for n in sorted(sizes):
        cases.append([world, dtype, n, 0 if n % 3 else 5, 0])
  rows, tail = _compare(cases, calls=6, sync=True)
  assert len(rows) == len(cases), tail
  bad = [r for r in rows if r["status"] not in ("pass", "skipped")]
  assert not bad, bad[:3]
  passed = [r for r in rows if r["status"] == "pass"]
  assert all(r["equal"] and r["reference"] for r in passed)
  # Everything but the largest sizes at 16 ranks fits on one GPU.
  assert len(passed) >= len(cases) - 4 * 3 * 2, [r for r in rows if r["status"] != "pass"]
  rows, tail = _compare([[w, "bfloat16", 4200, 1, 4294967290] for w in (2, 5, 8)], calls=12,
                        sync=False, seed=1)
  assert [r["status"] for r in rows] == ["pass"] * 3, rows
