"""The two-shot LL all-reduce on the loopback harness (one GPU, every rank
simulated on it): ``python -m jax_llar.tools.loopback --algorithm=two_shot_ll``.

Sizes below, at and beyond the one-shot limit up to the two-shot's 4 MiB,
element and line counts not divisible by the number of ranks (chunks of
unequal length, payloads of fewer lines than ranks), synchronised and not,
from epoch 0, across the re-zeroing window (every 2^14 epochs) and across
the LL flags' 16-bit epoch wrap. Every dtype runs every size up to 256 KiB;
above that (several steps per thread, the 4 MiB limit) float32 and bfloat16
stand for the 4- and 2-byte element paths, since the step and chunk
arithmetic depends on bytes and ranks, not on the dtype. What passes here is
the protocol logic and the reduction, not NVLink: every store is local to
the one GPU.
"""

from __future__ import annotations

from loopback_helpers import run_tool, statuses

TWO = "--algorithm=two_shot_ll"
# 1 element (fewer lines than ranks), odd tails, non-divisible line counts,
# beyond the one-shot limit; then several steps per thread, the two-shot limit.
SMALL = "4,6,100,4100,65540,262148"
LARGE = "1048580,4194304"


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


def test_two_shot_synchronised(tmp_path):
  """Worlds 2, 3, 4, 8 (the kernels for 2, 4, 8 ranks and the generic one),
  every dtype, up to 256 KiB, 50 calls, from epoch 0 and across the flag
  wrap (and the re-zeroing window just before it)."""
  rc, record, tail = run_tool(tmp_path, TWO, "--worlds=2,3,4,8",
                              "--dtypes=float32,bfloat16,float16,int32",
                              f"--sizes={SMALL}", "--calls=50",
                              "--start_epochs=0,4294967270")
  assert record is not None, tail
  assert rc == 0 and not _problems(record), tail
  passed = _passed(record)
  for world in (2, 3, 4):
    for dtype in ("float32", "bfloat16", "float16", "int32"):
      for n in (4, 100, 4100, 65540, 262148):
        for e in (0, 4294967270):
          assert (world, dtype, n, e) in passed, (world, dtype, n, e, tail)
  assert {(8, "float32", n, 0) for n in (4, 100, 4100, 65540, 262148)} <= passed, tail
  assert all(r["impl"] == "loopback.two_shot_ll" for r in record["rows"])
  kernels = {(r["world_size"], r["kernel"]) for r in record["rows"] if r["status"] == "pass"}
  assert {(2, "world 2"), (4, "world 4"), (8, "world 8"), (3, "generic")} <= kernels


def test_two_shot_large_payloads_synchronised(tmp_path):
  """1 MiB + 4 B and 4 MiB (several steps per thread, the limit), float32
  and bfloat16, worlds 2, 3, 4, 20 calls from epoch 0 and from 2^32 - 16
  (the re-zeroing window and the flag wrap inside the run)."""
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


def test_two_shot_ranks_running_ahead_and_misaligned(tmp_path):
  """No synchronisation between calls (ranks run calls ahead of each other,
  both regions and both halves in use at once), 8-byte misaligned buffers
  (the byte-wise path), across the re-zeroing window; up to 1 MiB + 4 B."""
  rc, record, tail = run_tool(tmp_path, TWO, "--worlds=2,3,4,8", "--dtypes=float32,bfloat16",
                              f"--sizes={SMALL},1048580", "--calls=50", "--sets=2",
                              "--no_sync", "--misalign=4", "--start_epochs=0,1073741800")
  assert record is not None, tail
  assert rc == 0 and not _problems(record), tail
  passed = _passed(record)
  for world in (2, 3, 4):
    for n in (4, 100, 4100, 65540, 262148, 1048580):
      assert (world, "float32", n, 1073741800) in passed, (world, n, tail)
