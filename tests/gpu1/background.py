"""What the one-GPU suite runs in the background from the session's start
(a test seam of the suite, started by conftest.py's `background` fixture):
the selected fault tests' child processes (fault_cases.py), one at a time.

Rules: a fault child runs beside the in-process tests, whose kernels never
trap, and the fault tests run last (conftest.py orders them) and wait for
the rows; two trapping processes never run at once (the children run one
after another, and the sanitizer's cross-section, whose fault unit traps,
starts only after the last child has ended); no sanitized run goes in the
background (it time-slices the GPU with the in-process tests). What each
rule was measured against: benchmarks/NOTES.md.
"""

from __future__ import annotations

import concurrent.futures
import threading

import fault_cases


class Background:
  """The background work of one session: the fault cases of `names` (every
  one when None)."""

  def __init__(self, names=None):
    self._stop = threading.Event()
    self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    self._faults = self._pool.submit(fault_cases.run_every_case, names, self._stop)

  def fault_rows(self) -> dict:
    """The fault cases' rows (fault_cases.run_every_case), once they ran."""
    return self._faults.result()

  def faults_done(self) -> None:
    """Returns once no fault child runs (any failure of theirs is the fault
    tests' to report)."""
    concurrent.futures.wait([self._faults])

  def close(self) -> None:
    """Starts no further child and waits for the one running (an
    interrupted or failed session does not wait for the rest)."""
    self._stop.set()
    self._pool.shutdown(wait=True, cancel_futures=True)
