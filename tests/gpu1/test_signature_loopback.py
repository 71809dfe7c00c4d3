"""Call signatures on one GPU without a fault: every call correct with
signatures off, and with signatures that wrap past 65535 while the ranks
run calls ahead of each other. The signature faults of every signed
algorithm are test_faults_loopback.py's."""

from __future__ import annotations

from loopback_helpers import run_tool, statuses


def test_signatures_off_and_a_seed_that_wraps(tmp_path):
  """--nosignatures (every call 0) and signatures that wrap past 65535, with
  ranks running calls ahead of each other: every call correct, no report."""
  for flag in ("--nosignatures", "--signature_seed=65530"):
    rc, record, tail = run_tool(tmp_path, flag, "--algorithm=one_shot_ll", "--worlds=2,5",
                                "--dtypes=bfloat16", "--sizes=100,4096", "--calls=12",
                                "--no_sync", "--start_epochs=65530")
    assert record is not None, tail
    assert rc == 0 and statuses(record) == {"pass": 4}, (flag, tail)
