"""The two-shot LL128 atomic all-reduce on the loopback harness (one GPU,
every rank simulated on it): ``python -m jax_llar.tools.loopback
--algorithm=two_shot_ll128_atomic``.

It is not deterministic, so the harness checks its rule instead of bitwise
equality (loopback_harness.check_mode): every rank's output has the same
bits, int32 is bitwise the rank-order reference, and every float element is
within jax_llar.testing.atomic_sum_violations's bound of the exact sum (NaN,
infinities and overflow as that function states), NaNs canonical; every
rank's epoch counters advanced once per call.

Covered, in two short runs (the file is meant to take well under a minute
on one H200): worlds 2, 3, 4, 5, 8 (the 2-, 4- and 8-rank kernels and the
run-time one), every dtype, one element, odd tails, one element past a
120-byte line, chunk counts not divisible by the number of ranks, several
steps per line slot (1 MiB and 4 MiB at 2 ranks, 4 MiB at 3), random inputs
with special values; consecutive calls synchronised (across the re-zeroing
window and the 32-bit flag wrap) and not synchronised (ranks run calls ahead:
both accumulator halves in use at once) with misaligned buffers (a rank
left out of a call: test_faults_loopback.py). What
passes here is the protocol on one GPU's L2, not NVLink: every add and store
is local (tests/gpu/test_two_shot_ll128_atomic.py is the 2-GPU suite).
"""

from __future__ import annotations

from loopback_helpers import run_tool, statuses
from test_ll128_loopback import _passed, _problems

ATOMIC = "--algorithm=two_shot_ll128_atomic"
DTYPES = ("float32", "bfloat16", "float16", "int32")


def _rule_checked(record):
  """Every row that ran was checked by the atomic-sum rule with identical
  ranks, and int32 rows equal the reference bitwise."""
  ran = [r for r in record["rows"] if r["status"] in ("pass", "fail")]
  assert ran
  for r in ran:
    assert r["check"] == "atomic_sum" and r["ranks_bitwise_equal"], r
    if r["dtype"] == "int32":
      assert r["differing_from_reference"] == 0, r
  return ran


def test_two_shot_ll128_atomic_synchronised(tmp_path):
  """Worlds 2, 3, 4, 8, every dtype, 6 calls from 2^32 - 4 (the re-zeroing
  epochs and the flag wrap inside the run); 4 B (fewer lines than ranks),
  6 B, 124 B, 4204 B (35 lines + 4 B), 65540 B."""
  rc, record, tail = run_tool(tmp_path, ATOMIC, "--worlds=2,3,4,8",
                              f"--dtypes={','.join(DTYPES)}",
                              "--sizes=4,6,124,4204,65540", "--calls=6", "--sets=3",
                              "--start_epochs=4294967292")
  assert record is not None, tail
  assert rc == 0 and not _problems(record), tail
  _rule_checked(record)
  passed = _passed(record)
  for world in (2, 3, 4, 8):
    for dtype in DTYPES:
      for n in (4, 124, 4204, 65540):
        assert (world, dtype, n, 4294967292) in passed, (world, dtype, n, tail)
    for dtype in ("bfloat16", "float16"):
      assert (world, dtype, 6, 4294967292) in passed, (world, dtype, tail)
  assert all(r["impl"] == "loopback.two_shot_ll128_atomic" for r in record["rows"])
  kernels = {(r["world_size"], r["kernel"]) for r in record["rows"] if r["status"] == "pass"}
  assert {(2, "world 2"), (4, "world 4"), (8, "world 8"), (3, "generic")} <= kernels


def test_two_shot_ll128_atomic_ranks_running_ahead_misaligned_several_steps(tmp_path):
  """No synchronisation between 8 calls, buffers 4 bytes off alignment,
  from epoch 0; sizes up to the 4 MiB limit (several steps per line slot)."""
  rc, record, tail = run_tool(tmp_path, ATOMIC, "--worlds=2,3,5", "--dtypes=float32,bfloat16",
                              "--sizes=124,65540,1048580,4194304", "--calls=8", "--sets=3",
                              "--no_sync", "--misalign=4", "--start_epochs=0")
  assert record is not None, tail
  assert rc == 0 and not _problems(record), tail
  _rule_checked(record)
  passed = _passed(record)
  for world in (2, 3, 5):
    for dtype in ("float32", "bfloat16"):
      for n in (124, 65540, 1048580):
        assert (world, dtype, n, 0) in passed, (world, dtype, n, tail)
  assert {(2, "float32", 4194304, 0), (3, "bfloat16", 4194304, 0)} <= passed, tail
  steps = {r["plan"]["steps"] for r in record["rows"] if r["status"] == "pass"}
  assert max(steps) >= 3, steps
