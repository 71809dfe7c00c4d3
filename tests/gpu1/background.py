"""What the one-GPU suite runs in the background from the session's start
(a test seam of the suite, started by conftest.py's `background` fixture).

Two kinds of work there spend most of their time outside this process and
leave the GPU mostly idle: the fault cases' child processes (starting
Python, JAX and a CUDA context, then one bounded wait that times out;
fault_cases.py) and the sanitizer's clean runs of the cross-section
(test_sanitize.py). Both start when the session does and run beside the
in-process tests, which never trap; the tests that check them run last
(conftest.py orders them) and wait for their results. What never runs at
the same time: two trapping processes (the fault children run one at a
time, and the cross-section's sanitized fault unit runs in the foreground
after every fault child has ended: with trapping processes side by side on
one H200 the others' bounded waits ended tens of seconds late,
benchmarks/NOTES.md).
"""

from __future__ import annotations

import concurrent.futures
import json
import pathlib
import subprocess
import sys

import fault_cases
from jax_llar.tools.sanitize import harness as sanitize

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The cross-section's units that trap on purpose run in the foreground.
SANITIZE_CLEAN = tuple(u.name for u in sanitize.SMALL if not u.fault)
SANITIZE_FAULT = tuple(u.name for u in sanitize.SMALL if u.fault)
# Sanitized runs at once in the background: enough to end before the suite
# does, few enough to leave the suite's own process its CPU.
SANITIZE_JOBS = 4


def sanitize_command(units, json_path, jobs=SANITIZE_JOBS):
  return [sys.executable, "-m", "jax_llar.tools.sanitize", "--matrix=small",
          "--units=" + ",".join(units), f"--jobs={jobs}", f"--json={json_path}"]


class Background:
  """The background work of one session; each part starts only when its
  tests were selected."""

  def __init__(self, folder: pathlib.Path, faults: bool, sanitized: bool):
    self.folder = folder
    self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    self._faults = self._pool.submit(fault_cases.run_every_case) if faults else None
    self._clean = None
    if sanitized and sanitize.find_sanitizer() is not None:
      self._clean_json = folder / "sanitize-clean.json"
      self._clean = subprocess.Popen(sanitize_command(SANITIZE_CLEAN, self._clean_json),
                                     cwd=ROOT, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)

  def fault_rows(self) -> dict:
    """Every fault case's rows (fault_cases.run_every_case), once they ran."""
    if self._faults is None:
      self._faults = self._pool.submit(fault_cases.run_every_case)
    return self._faults.result()

  def faults_done(self) -> None:
    """Returns once no fault child runs (any of its failures is the fault
    tests' to report)."""
    if self._faults is not None:
      concurrent.futures.wait([self._faults])

  def sanitize_clean(self, timeout_s: float = 900) -> tuple[list[dict], str]:
    """The cross-section's clean rows and the run's output, once it ended
    (started now if the background did not start it)."""
    if self._clean is None:
      self._clean_json = self.folder / "sanitize-clean.json"
      self._clean = subprocess.Popen(sanitize_command(SANITIZE_CLEAN, self._clean_json),
                                     cwd=ROOT, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
    out, _ = self._clean.communicate(timeout=timeout_s)
    assert self._clean_json.exists(), (out or "")[-6000:]
    rows = json.loads(self._clean_json.read_text())["rows"]
    return rows, out or ""

  def close(self) -> None:
    if self._clean is not None and self._clean.poll() is None:
      self._clean.kill()
      self._clean.communicate()
    self._pool.shutdown(wait=True, cancel_futures=True)
