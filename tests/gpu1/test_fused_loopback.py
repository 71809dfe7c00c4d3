"""The fused all-reduce + residual add + RMSNorm kernel on one GPU: the
loopback harness's fused mode (``python -m jax_llar.tools.loopback --op
add_rms_norm``, jax_llar.tools.loopback.fused) in a child process, every case
against the host emulation of the reference: new_residual bitwise, normed
within loopback_fused.NORMED_MAX_ULP, every rank bitwise identical, the
epoch counters shared with interleaved one-shot all-reduces. Not NVLink:
every store is local to the one GPU."""

from __future__ import annotations


from loopback_helpers import statuses
from loopback_helpers import run_tool as _run_tool


def run_tool(tmp_path, *args):
  """The tool's fused mode (loopback_helpers.run_tool)."""
  return _run_tool(tmp_path, "--op=add_rms_norm", *args)


def test_every_dtype_and_shape_two_ranks(tmp_path):
  """The brief's matrix (d 64, 2048, 4096; rows 1, 2, 8, 32), every dtype and
  weight dtype, two ranks (the specialised kernel); 32 x 4096 float32 is
  above the one-shot limit and skipped by the grid rule."""
  shapes = [f"{r}x{d}" for d in (64, 2048, 4096) for r in (1, 2, 8, 32)]
  rc, record, tail = run_tool(tmp_path, "--worlds=2", f"--shapes={','.join(shapes)}",
                              "--calls=4")
  assert record is not None, tail
  assert rc == 0, tail
  # float32 (one weight dtype) + bfloat16 and float16 (two each): 5 x 12 cases.
  assert statuses(record) == {"pass": 5 * 12 - 1, "skipped": 1}, tail
  assert all(r["normed_max_ulp"] <= 1 for r in record["rows"]
             if r["status"] == "pass" and r["dtype"] != "float32"), tail


def test_world_sizes_wide_rows_and_epoch_windows(tmp_path):
  """4 and 8 ranks (specialised), 3 and 5 (the run-time world-size kernel),
  the widest row (8 blocks of 512 lines), odd cluster splits, from epoch 0,
  across the re-zeroing window (every 2^14 epochs) and the LL flags' 16-bit
  epoch wrap (2^30 and 2^32 are multiples of both)."""
  rc, record, tail = run_tool(tmp_path, "--worlds=3,4,5,8", "--dtypes=bfloat16,float32",
                              "--shapes=1x16384,1x640,3x5120,64x64,8x4096", "--calls=6",
                              "--start_epochs=0,1073741821,4294967293")
  assert record is not None, tail
  assert rc == 0, tail
  counts = statuses(record)
  # Cases whose ranks' clusters do not fit on the GPU at once are skipped.
  assert counts.get("pass", 0) >= 4 * 3 * 5 * 3 // 2 and set(counts) <= {"pass", "skipped"}, tail
  for row in record["rows"]:
    if row["status"] == "skipped":
      assert "do not fit" in row["reason"] or "not served" in row["reason"], row
