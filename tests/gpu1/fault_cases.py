"""The fault cases of the one-GPU suite (test_faults_loopback.py): their
specs and the runner of their child processes, in a file of its own so that
the suite's conftest can start them in the background at the session's
start (background.py) while the in-process tests run.

Each case runs in a child process of its own (the kernels trap, which loses
the child's CUDA context; ``loopback_harness.run_fault_case``), one at a
time: with several trapping children at once on one H200 the bounded waits
of the others ended tens of seconds late or not before the host's deadline
(benchmarks/NOTES.md). One trapping child beside the suite's own process,
whose kernels never trap, is what the background runs.
"""

from __future__ import annotations

from jax_llar.tools.loopback import harness as lh

SIGNATURE_TIMEOUT_MS = 10000


# The bound of a left-out rank's case: the other ranks spin this long before
# they trap, and while they spin every kernel of the suite's own process
# waits for its time slice (benchmarks/NOTES.md), so it is short. Every rank
# of a call is launched within microseconds of the others, so the calls
# before the fault never come near it.
SKIP_TIMEOUT_MS = 250


def _skip(algorithm, worlds, sizes, start_epochs, *, rank=2, call=3, calls=6,
          dtype="float32", sync=True):
  s = lh.Settings(worlds=worlds, dtypes=(dtype,), sizes=sizes, calls=calls,
                  timeout_ms=SKIP_TIMEOUT_MS, start_epochs=start_epochs, sync=sync,
                  algorithm=algorithm)
  return s, {"skip_rank": rank, "skip_call": call}


def _mispaired(algorithm, fault, world):
  s = lh.Settings(worlds=(world,), dtypes=("float32",), sizes=(4096,), calls=6,
                  timeout_ms=SIGNATURE_TIMEOUT_MS, start_epochs=(65533,), algorithm=algorithm)
  return s, {"skip_rank": -1, "skip_call": 0, "fault": fault, "fault_rank": 1,
             "fault_call": 3}


WRAP = 4294967293  # 2^32 - 3: call 3 is the first past the 32-bit wrap
SKIPS = {
    "one_shot_ll": _skip("one_shot_ll", (3, 8), (1024,), (WRAP,)),
    "one_shot_ll.nosync16": _skip("one_shot_ll", (16,), (4096,), (0,), rank=15, call=7,
                                  calls=8, dtype="bfloat16", sync=False),
    "one_shot_ll128": _skip("one_shot_ll128", (3,), (4200,), (WRAP,)),
    "one_shot_sentinel": _skip("one_shot_sentinel", (3,), (1024,), (5,)),
    "two_shot_ll": _skip("two_shot_ll", (3,), (262148,), (WRAP,)),
    "two_shot_ll128": _skip("two_shot_ll128", (3,), (262148,), (WRAP,)),
    "two_shot_ll128_atomic": _skip("two_shot_ll128_atomic", (3,), (4204,), (100,)),
}
MISPAIRED = {
    "one_shot_ll.extra_call": _mispaired("one_shot_ll", "extra_call", 3),
    "one_shot_ll.swap_signature": _mispaired("one_shot_ll", "swap_signature", 2),
    "two_shot_ll.extra_call": _mispaired("two_shot_ll", "extra_call", 2),
    "one_shot_ll128.swap_signature": _mispaired("one_shot_ll128", "swap_signature", 3),
    "two_shot_ll128.extra_call": _mispaired("two_shot_ll128", "extra_call", 3),
}


def run_all(specs, stop=None):
  """Every case of every spec, each in its child, one at a time; returns
  {name: rows}, rows in case order. With `stop` (a threading.Event) set, no
  further child starts (the rows so far are returned)."""
  out = {}
  for name, (s, fault) in specs.items():
    assert not lh.validate(s), (name, lh.validate(s))
    out[name] = []
    for case, reason in lh.cases(s):
      assert reason is None, (name, case, reason)
      if stop is not None and stop.is_set():
        return out
      out[name].append(lh.run_fault_case(s, case, **fault))
  return out


def run_every_case(names=None, stop=None):
  """Both families' cases (of the spec `names` given, else every one), one
  at a time: ``{"skipped": {name: rows}, "mispaired": {name: rows}}``."""
  pick = lambda specs: {n: v for n, v in specs.items() if names is None or n in names}
  return {"skipped": run_all(pick(SKIPS), stop), "mispaired": run_all(pick(MISPAIRED), stop)}
