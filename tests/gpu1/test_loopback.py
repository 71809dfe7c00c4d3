"""The loopback harness on one GPU: every world size 2-16 simulated on it.

Each test runs ``python -m jax_llar.tools.loopback`` in a child process
(CUDA_DEVICE_MAX_CONNECTIONS must be set before CUDA starts, and the fault
mode loses a CUDA context on purpose) and reads its JSON record. What passes
here is the protocol logic and the reduction, not NVLink: every store is
local to the one GPU.
"""

from __future__ import annotations


from loopback_helpers import run_tool, statuses


def test_every_world_size_synchronised(tmp_path):
  """Specialised (2, 4, 8) and generic kernels, every dtype, tails and full
  lines, from epoch 0 and from 2^32 - 6: across the re-zeroing window
  (every 2^14 epochs) and the LL flags' 16-bit epoch wrap."""
  rc, record, tail = run_tool(tmp_path, "--worlds=2,3,4,5,8,16",
                              "--dtypes=float32,bfloat16,float16,int32",
                              "--sizes=4,6,100,4096,65536", "--calls=20",
                              "--start_epochs=0,4294967290")
  assert record is not None, tail
  assert rc == 0, tail
  # 6 bytes is no whole number of 4-byte elements: skipped for float32, int32.
  assert statuses(record) == {"pass": 6 * 4 * 5 * 2 - 6 * 2 * 2, "skipped": 6 * 2 * 2}, tail
  kernels = {(r["world_size"], r["kernel"]) for r in record["rows"] if r["status"] == "pass"}
  assert {(2, "world 2"), (4, "world 4"), (8, "world 8"), (3, "generic"),
          (16, "generic")} <= kernels
  assert "not NVLink" in record["note"]


def test_ranks_running_ahead_generic_and_misaligned(tmp_path):
  """No synchronisation between calls (ranks run calls ahead of each
  other), the generic kernel for 2, 4 and 8 ranks, 8-byte misaligned buffers."""
  rc, record, tail = run_tool(tmp_path, "--worlds=2,4,8,16", "--dtypes=float32,bfloat16",
                              "--sizes=100,4096,98304", "--calls=40", "--no_sync",
                              "--generic", "--misalign=4", "--start_epochs=0,1073741800")
  assert record is not None and rc == 0, tail
  assert statuses(record) == {"pass": 4 * 2 * 3 * 2}, tail
  assert all(r["kernel"] == "generic" for r in record["rows"])


def test_grids_that_do_not_fit_are_skipped_not_run(tmp_path):
  """16 ranks of 256 KiB need more resident blocks than one GPU has."""
  rc, record, tail = run_tool(tmp_path, "--worlds=16", "--dtypes=float32",
                              "--sizes=262144", "--calls=2")
  assert record is not None, tail
  assert rc == 1 and statuses(record) == {"skipped": 1}, tail
  assert "not co-resident" in record["rows"][0]["reason"]
