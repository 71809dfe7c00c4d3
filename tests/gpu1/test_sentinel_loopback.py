"""The one-shot sentinel all-reduce on the loopback harness (one GPU, every
rank simulated on it): ``python -m jax_llar.tools.loopback
--algorithm=one_shot_sentinel``; what is the sentinel's own.

The outputs bitwise equal to the one-shot LL's on the same inputs (every
float16 and bfloat16 NaN and a float32 sample in every position of a line,
all-ones words, -0.0, subnormals, inf), NaN bits included, every NaN the
canonical one (sentinel.cuh and reduce.cuh, NaN results), at worlds 2-16,
synchronised and not; buffers 8 bytes off a 16-byte boundary (its byte-wise
path); 1000 calls in a row (epoch parity and the re-arming of every slot);
int32 refused before any launch. Its matrix (world sizes 2-16, the three
float dtypes, one element to its 512 KiB limit, synchronised from epoch 0
and from an odd epoch, int32 skipped with the reason) and its run of the
run-time-world kernel not synchronised, 4 bytes off 16-byte alignment, are
test_algorithms_loopback.py's; a rank left out: test_faults_loopback.py. What
passes here is the protocol logic and the reduction, not NVLink: every store
is local to the one GPU.

With JAX_LLAR_GPU1_RESULTS=DIR each tool run's JSON record is also copied to
DIR/sentinel-<test>.json.
"""

from __future__ import annotations

import pytest

from jax_llar.algorithms import Algorithm
from jax_llar.tools import _native

from loopback_helpers import ALLOWED_SKIPS, problems, run_tool, statuses

SENT = "--algorithm=one_shot_sentinel"
FLOATS = ("float32", "bfloat16", "float16")
ALLOWED = ALLOWED_SKIPS + ("float32, bfloat16 and float16 only",)


def _run(tmp_path, name, *args):
  return run_tool(tmp_path, *args, keep_as=f"sentinel-{name}")


def _problems(record):
  """Rows that neither passed nor were skipped for a reason stated up front."""
  return problems(record, ALLOWED)


def test_sentinel_refuses_int32_before_any_launch():
  """The native harness refuses int32 for the sentinel (ValueError, no CUDA
  call), as its launcher does (cudaErrorInvalidValue)."""
  mod = _native.load()
  with pytest.raises(ValueError, match="does not serve int32"):
    mod.loopback_plan(2, 1024, mod.DTYPE_CODES["int32"],
                      algorithm=int(Algorithm.ONE_SHOT_SENTINEL))
  plan = dict(mod.loopback_plan(2, 1024, mod.DTYPE_CODES["float32"],
                                algorithm=int(Algorithm.ONE_SHOT_SENTINEL)))
  assert plan["blocks"] == 1 and plan["threads"] == 64 and plan["co_resident"]


def test_sentinel_is_bitwise_the_one_shot_ll_nan_bits_included(tmp_path):
  """Every case runs the one-shot LL on the same inputs too. Input set 2
  carries every float16 and bfloat16 NaN and a float32 sample at every
  position of a line, alone and beside other NaNs, and all-ones words (the
  sentinel) beside the replacement the sender makes of them; set 1 -0.0,
  subnormals, inf, inf - inf, overflow and ties. Both outputs are equal bit
  for bit, NaNs included, and every NaN is the canonical one (reduce.cuh's
  rule for every algorithm), with and without synchronised ranks."""
  rc, record, tail = _run(tmp_path, "bitwise-nan", SENT, "--bitwise_against=one_shot_ll",
                          "--canonical_nan", "--nan_patterns",
                          "--worlds=2,3,4,8,16", "--dtypes=float32,bfloat16,float16",
                          "--sizes=98304,98306,4100", "--calls=8", "--sets=4",
                          "--start_epochs=0,1")
  assert record is not None, tail
  assert rc == 0 and not _problems(record), (_problems(record)[:3], tail)
  rows = [r for r in record["rows"] if r["status"] == "pass"]
  assert all(r["bitwise_equal"] and r["ranks_bitwise_equal"] for r in rows)
  assert all(r["non_canonical_nans"] == 0 for r in rows)
  assert {(r["world_size"], r["dtype"]) for r in rows if r["bytes_per_rank"] == 98304} == {
      (w, d) for w in (2, 3, 4, 8, 16) for d in FLOATS}
  assert all(r["nan_bits"] for r in rows if r["bytes_per_rank"] == 98304)
  for world, dtypes, n in ((2, "float32,float16,bfloat16", 3), (5, "float16,bfloat16", 2)):
    rc, record, tail = _run(tmp_path, f"bitwise-nan-nosync{world}", SENT,
                            "--bitwise_against=one_shot_ll", "--canonical_nan",
                            "--nan_patterns", f"--worlds={world}", f"--dtypes={dtypes}",
                            "--sizes=98304", "--calls=12", "--no_sync")
    assert record is not None and rc == 0 and statuses(record) == {"pass": n}, tail


def test_sentinel_buffers_8_byte_aligned_not_16(tmp_path):
  """Buffers 8 bytes off a 16-byte boundary: aligned for LL lines, not for
  the sentinel's 16-byte accesses (its byte-wise path), without
  synchronisation."""
  rc, record, tail = _run(tmp_path, "misalign8", SENT, "--worlds=2,3,8",
                          "--dtypes=float16,float32", "--sizes=20,4100,65536", "--calls=20",
                          "--no_sync", "--misalign=8")
  assert record is not None, tail
  assert rc == 0 and not _problems(record) and statuses(record) == {"pass": 18}, tail


def test_sentinel_a_thousand_calls(tmp_path):
  """1000 consecutive calls (each slot written, read and re-armed 500 times
  per half), synchronised for 2 ranks and free-running for 3 and 8; the
  outputs of the last calls (as many as 256 MiB, then 64 MiB, hold) are
  checked."""
  rc, record, tail = _run(tmp_path, "1000-calls-sync", SENT, "--worlds=2",
                          "--dtypes=bfloat16", "--sizes=16,4096,65552", "--calls=1000")
  assert record is not None and rc == 0 and statuses(record) == {"pass": 3}, tail
  rc, record, tail = _run(tmp_path, "1000-calls-nosync", SENT, "--worlds=3,8",
                          "--dtypes=bfloat16,float32", "--sizes=16,65552", "--calls=1000",
                          "--no_sync", "--start_epochs=1", "--max_output_mib=64")
  assert record is not None and rc == 0 and statuses(record) == {"pass": 8}, tail
  assert all(r["calls_checked"] >= 100 for r in record["rows"])
