"""The loopback harness on one GPU (every rank simulated on it): what is no
one algorithm's. A case whose ranks' grids do not fit on the GPU at once is
skipped with the reason, not run. The loopback tool runs in this process
(loopback_helpers.run_tool); every algorithm's runs, the one-shot LL's
included (every world size 2-16 synchronised, the run-time kernel not
synchronised), are test_algorithms_loopback.py's. What passes here is the
protocol logic and the reduction, not NVLink: every store is local to the
one GPU.
"""

from __future__ import annotations


from loopback_helpers import run_tool, statuses


def test_grids_that_do_not_fit_are_skipped_not_run(tmp_path):
  """16 ranks of 256 KiB need more resident blocks than one GPU has."""
  rc, record, tail = run_tool(tmp_path, "--worlds=16", "--dtypes=float32",
                              "--sizes=262144", "--calls=2")
  assert record is not None, tail
  assert rc == 1 and statuses(record) == {"skipped": 1}, tail
  assert "not co-resident" in record["rows"][0]["reason"]
