"""The fault modes of every simulated algorithm on the loopback harness (one
GPU): a rank left out of a call, and a call paired with a call of another
signature. The cases and their child processes: fault_cases.py (one at a
time, in the background from the session's start while the in-process
tests run: background.py). A child costs about 6 s, so each kernel's
failure path is covered once, not at every size.

A rank left out (``skip``): rank R's kernel is never launched on one call;
every other rank must end in the bounded wait's report (naming R, or for the
two-shots a chunk owner whose reduction waits for R) at that call's epoch,
within the timeout (`lh.fault_problems`), never a hang. Covered: every
algorithm at 3 ranks (the run-time world-size kernel), the one-shot LL also
at 8 (a specialised kernel) and at 16 without synchronising the ranks;
across the flag wrap (from 2^32 - 3; the sentinel from an odd epoch); the
two-shots past the one-shot limit (several chunks a block); the sentinel's
fold of all three flag fields (nothing arrived).

A mispaired call (``extra_call``: rank 1 runs one extra call of another
signature before call 3; ``swap_signature``: rank 1's call 3 carries another
signature), for every signed algorithm, both faults for the one-shot LL,
from 2^16 - 3 (the faulty call is the first after the LL flags' 16-bit
wrap, right after a re-zeroing window): every report is the
foreign-signature error (code 2) naming both signatures, written long
before the timeout (`lh.signature_fault_problems`); the kernels trap, so no
call completes with another call's data. Every other one-GPU test runs with
signatures on (a different one per call), so none of them may meet a
foreign line either.

What passes here is the protocol's failure path, not NVLink.
"""

from __future__ import annotations

import pytest

from jax_llar.tools.loopback import harness as lh

from fault_cases import MISPAIRED, SIGNATURE_TIMEOUT_MS, SKIPS


@pytest.fixture(name="fault_rows", scope="module")
def _fault_rows(background):
  """Every fault case's rows: the children ran one at a time in the
  background from the session's start (background.py)."""
  return background.fault_rows()


@pytest.fixture(scope="module")
def skipped(fault_rows):
  return fault_rows["skipped"]


@pytest.fixture(scope="module")
def mispaired(fault_rows):
  return fault_rows["mispaired"]


def _lines(rows):
  return "\n".join(lh._line(r) for r in rows)  # pylint: disable=protected-access


@pytest.mark.parametrize("name", sorted(SKIPS))
def test_a_rank_left_out_ends_in_the_bounded_wait_error(skipped, name):
  rows = skipped[name]
  s, fault = SKIPS[name]
  assert rows and all(r["status"] == "pass" for r in rows), _lines(rows)
  left_out = fault["skip_rank"]
  for row in rows:
    assert row["records"] and row["cuda_error"] and not row["deadline_exceeded"], row
    if s.algorithm.startswith("two_shot"):
      # A chunk owner may be the one the others wait for.
      assert all(r["peer"] != r["rank"] and r["rank"] != left_out for r in row["records"]), row
    else:
      assert all(r["peer"] == left_out for r in row["records"]), row
    if s.algorithm == "one_shot_sentinel":
      # Nothing arrived: the sentinel's fold in all three flag fields.
      assert all(r["flag_seen"] == r["flag_seen2"] == 0xFFFFFFFF for r in row["records"]), row
  assert {(r["world_size"], r["bytes_per_rank"], r["start_epoch"]) for r in rows} == {
      (w, n, e) for w in s.worlds for n in s.sizes for e in s.start_epochs}


@pytest.mark.parametrize("name", sorted(MISPAIRED))
def test_a_mispaired_call_ends_in_the_foreign_signature_error(mispaired, name):
  rows = mispaired[name]
  _, fault = MISPAIRED[name]
  assert [r["status"] for r in rows] == ["pass"], _lines(rows)
  for row in rows:
    assert row["fault"] == fault["fault"] and row["cuda_error"], row
    assert row["records"] and all(r["code"] == lh.FOREIGN_SIGNATURE for r in row["records"])
    # Seen at once: long before the timeout, on the device and on the host.
    assert all(r["waited_ns"] < SIGNATURE_TIMEOUT_MS * 1e6 for r in row["records"]), row
    assert row["seconds_to_error"] < SIGNATURE_TIMEOUT_MS / 1e3, row
