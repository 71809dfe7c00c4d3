"""The two-shot LL128 all-reduce on the loopback harness (one GPU, every rank
simulated on it): ``python -m jax_llar.tools.loopback
--algorithm=two_shot_ll128``, and a child program that runs the two-shot LL
and the two-shot LL128 on the same inputs.

Sizes of fewer lines than ranks, odd tails, chunk counts not divisible by
the number of ranks, one element either side of a multiple of the 120-byte
line, several steps per line slot, the 4 MiB limit; 20-50 calls,
synchronised and not, misaligned buffers, from epoch 0, across the
re-zeroing window (every 2^14 epochs) and across the flag word's 32-bit epoch
wrap (from 2^32 - 16, inside the 20 calls); a rank left out of a call:
test_faults_loopback.py. Every dtype runs every size up to 480 KiB;
above that float32 and bfloat16 stand for the 4- and 2-byte element paths
(the step and chunk arithmetic depends on bytes and ranks, not the dtype). What passes here is the protocol
logic and the reduction on one GPU's L2, not NVLink: every store is local.
"""

from __future__ import annotations

from loopback_helpers import run_tool, statuses
from test_ll128_loopback import _compare, _passed, _problems

TWO = "--algorithm=two_shot_ll128"
# 1 element (fewer lines than ranks), odd tails, non-divisible line counts,
# beyond the one-shot limits, several steps per slot (2 ranks: above
# 2 x 4096 lines), the limit.
SMALL = "4,6,124,4204,65540,491524"
LARGE = "1048580,4194304"


def test_two_shot_ll128_synchronised(tmp_path):
  rc, record, tail = run_tool(tmp_path, TWO, "--worlds=2,3,4,8",
                              "--dtypes=float32,bfloat16,float16,int32",
                              f"--sizes={SMALL}", "--calls=20",
                              "--start_epochs=0,4294967280")
  assert record is not None, tail
  assert rc == 0 and not _problems(record), tail
  passed = _passed(record)
  for world in (2, 3, 4):
    for dtype in ("float32", "bfloat16", "float16", "int32"):
      for n in (4, 124, 4204, 65540, 491524):
        for e in (0, 4294967280):
          assert (world, dtype, n, e) in passed, (world, dtype, n, e, tail)
  assert {(8, "float32", n, 0) for n in (4, 124, 4204, 65540)} <= passed, tail
  assert all(r["impl"] == "loopback.two_shot_ll128" for r in record["rows"])
  kernels = {(r["world_size"], r["kernel"]) for r in record["rows"] if r["status"] == "pass"}
  assert {(2, "world 2"), (4, "world 4"), (8, "world 8"), (3, "generic")} <= kernels


def test_two_shot_ll128_large_payloads_synchronised(tmp_path):
  """1 MiB + 4 B and 4 MiB (several steps per line slot, the limit), float32
  and bfloat16, worlds 2, 3, 4, from epoch 0 and across the flag wrap."""
  rc, record, tail = run_tool(tmp_path, TWO, "--worlds=2,3,4", "--dtypes=float32,bfloat16",
                              f"--sizes={LARGE}", "--calls=20", "--sets=2",
                              "--start_epochs=0,4294967280")
  assert record is not None, tail
  assert rc == 0 and not _problems(record), tail
  passed = _passed(record)
  for dtype in ("float32", "bfloat16"):
    for e in (0, 4294967280):
      for world in (2, 3, 4):
        assert (world, dtype, 1048580, e) in passed, (world, dtype, e, tail)
      assert (2, dtype, 4194304, e) in passed, (dtype, e, tail)
  assert max(r["plan"]["steps"] for r in record["rows"] if r["status"] == "pass") >= 2


def test_two_shot_ll128_ranks_running_ahead_and_misaligned(tmp_path):
  rc, record, tail = run_tool(tmp_path, TWO, "--worlds=2,3,5", "--dtypes=float32,bfloat16",
                              f"--sizes={SMALL},1048580", "--calls=50", "--sets=2",
                              "--no_sync", "--misalign=4", "--start_epochs=0,1073741800")
  assert record is not None, tail
  assert rc == 0 and not _problems(record), tail
  passed = _passed(record)
  for world in (2, 3, 5):
    for n in (4, 124, 4204, 65540, 491524, 1048580):
      assert (world, "float32", n, 1073741800) in passed, (world, n, tail)


def test_two_shot_ll128_output_is_bitwise_the_two_shot_lls():
  """Same input sets (random, with special values) through the two-shot LL
  and the two-shot LL128: every output bit equal (NaNs by position), and the
  float64 rank-order reference."""
  cases = []
  for world in (2, 3, 5, 8):
    for dtype, s in (("float32", 4), ("bfloat16", 2), ("int32", 4)):
      for n in (s, 120 - s, 120 * 7 + s, 120 * 4097 - s, 120 * 8193 + s):
        cases.append([world, dtype, n, 0 if n % 3 else 4, 0])
  rows, tail = _compare(cases, calls=4, sync=True,
                        algorithms=["two_shot_ll", "two_shot_ll128"])
  assert len(rows) == len(cases), tail
  bad = [r for r in rows if r["status"] not in ("pass", "skipped")]
  assert not bad, bad[:3]
  passed = [r for r in rows if r["status"] == "pass"]
  assert all(r["equal"] and r["reference"] for r in passed)
  assert {(r["world_size"], r["dtype"]) for r in passed} >= {
      (w, d) for w in (2, 3, 5) for d in ("float32", "bfloat16", "int32")}
