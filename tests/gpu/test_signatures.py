"""Call signatures on 2 GPUs (issue 12, item 1): mispaired calls end in the
foreign-signature error, never in a wrong sum.

Each test runs a child program (tests/gpu/programs/): the error traps and
loses the child's CUDA context, not the test process's.
  * two Python threads hammer two different programs (different sizes and
    dtypes) on the same devices, 100000 executions each: only correct sums,
    or the foreign-signature error (code 2) if the GPUs ever paired one
    program's call with the other's;
  * a rank-dependent extra psum (lax.cond on axis_index) followed by two more
    psums of the same shape: the ranks are paired off by one, and the call
    fails with the foreign-signature error naming both calls.
The loopback versions of both faults, for every signed algorithm, are
tests/gpu1/test_signature_loopback.py.
"""

from __future__ import annotations

from gpu_helpers import run_program


def test_two_threads_hammering_different_programs_never_get_a_wrong_sum():
  p = run_program("signature_threads", env={"JAX_LLAR_TIMEOUT_MS": "3000"}, timeout=1800)
  assert p.data is not None, p.tail
  assert p.data["fast"] is True and p.data["ok_first"] is True, p.tail
  assert p.data["hung"] is False, p.tail
  assert p.data["wrong"] == 0, p.data
  # The three psums (one in program 0, two in program 1) carry distinct signatures.
  assert sum(len(v) for v in p.data["signatures"].values()) == 3, p.data["signatures"]
  assert len(p.data["signatures"]) == 3, p.data["signatures"]
  if p.data["errors"]:
    # A mispairing happened: it must be the foreign-signature error.
    assert p.data["reports"], p.data
    assert all(r["code"] == 2 and r["what"] == "foreign signature"
               for r in p.data["reports"]), p.data["reports"]
  else:
    assert p.data["calls"] == [100_000, 100_000], p.data


def test_rank_dependent_extra_call_ends_in_the_signature_error():
  p = run_program("off_by_one", env={"JAX_LLAR_TIMEOUT_MS": "10000"})
  assert p.data is not None, p.tail
  assert p.data["fast"] is True, p.tail
  assert p.data["error"] is not None and p.data["out_ok"] is None, p.data
  reports = p.data["reports"]
  assert reports, p.tail
  sigs = {int(k) for k in p.data["signatures"]}
  for r in reports:
    assert r["code"] == 2 and r["what"] == "foreign signature", r
    assert r["signature_expected"] != r["signature_seen"], r
    assert {r["signature_expected"], r["signature_seen"]} <= sigs, (r, sigs)
    assert r["calls_expected"] and r["calls_seen"], r
    assert r["waited_ns"] < 10e9, r  # at once, not at the timeout
    assert "restart the process" in r["message"], r
