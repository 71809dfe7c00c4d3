"""Call signatures on one GPU (issue 12, item 1): the loopback harness's
signature faults for every signed algorithm.

Each test runs ``python -m jax_llar.tools.loopback`` with a signature fault,
each case in a child process (the trap loses its CUDA context): rank 1 runs
one extra call of another signature before call 3 (``--extra_call_rank``,
the ranks paired off by one, as after a rank-dependent extra call), or
rank 1's call 3 carries another signature (``--swap_signature_rank``, as
when two programs interleave differently on its GPU). Every report must be
the foreign-signature error (code 2) naming both signatures, written before
the timeout ran out (the harness's ``signature_fault_problems``); the kernels
trap, so no call completes with another call's data. The epochs start at
2^16 - 3: the faulty call is the first after the LL flags' 16-bit epoch
wrap, right after a re-zeroing window. Every other one-GPU test runs with
signatures on too (a different one per call), so none of them may meet a
foreign line either.
"""

from __future__ import annotations

import pytest

from loopback_helpers import run_tool, statuses

SIGNED = ("one_shot_ll", "two_shot_ll", "one_shot_ll128", "two_shot_ll128")
TIMEOUT_MS = 10000


@pytest.mark.parametrize("fault", ["extra_call", "swap_signature"])
@pytest.mark.parametrize("algorithm", SIGNED)
def test_a_mispaired_call_ends_in_the_foreign_signature_error(tmp_path, algorithm, fault):
  rc, record, tail = run_tool(tmp_path, f"--algorithm={algorithm}", f"--{fault}_rank=1",
                              "--fault_call=3", "--calls=6", "--worlds=2,3",
                              "--dtypes=float32", "--sizes=4096",
                              f"--timeout_ms={TIMEOUT_MS}", "--start_epochs=65533",
                              timeout=400)
  assert record is not None, tail
  assert rc == 0 and statuses(record) == {"pass": 2}, tail
  for row in record["rows"]:
    assert row["fault"] == fault and row["cuda_error"], row
    assert row["records"] and all(r["code"] == 2 for r in row["records"]), row
    # Seen at once: long before the timeout, on the device and on the host.
    assert all(r["waited_ns"] < TIMEOUT_MS * 1e6 for r in row["records"]), row
    assert row["seconds_to_error"] < TIMEOUT_MS / 1e3, row


def test_signatures_off_and_a_seed_that_wraps(tmp_path):
  """--nosignatures (every call 0) and signatures that wrap past 65535, with
  ranks running calls ahead of each other: every call correct, no report."""
  for flag in ("--nosignatures", "--signature_seed=65530"):
    rc, record, tail = run_tool(tmp_path, flag, "--algorithm=one_shot_ll", "--worlds=2,5",
                                "--dtypes=bfloat16", "--sizes=100,4096", "--calls=12",
                                "--no_sync", "--start_epochs=65530")
    assert record is not None, tail
    assert rc == 0 and statuses(record) == {"pass": 4}, (flag, tail)
