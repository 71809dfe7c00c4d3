"""Progress lines with an estimate of the time left, for the tools' long runs
(issue 14: benchmarks, tune, soak and the examples show how far they are).

The estimate is the mean time per finished unit so far times the units left:
units that grow (larger sizes) make early estimates run low, which the line
does not hide (it says "about").
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


def duration(seconds: float) -> str:
  """``"1h02m"``, ``"3m05s"`` or ``"0m07s"`` for a number of seconds."""
  s = int(round(max(seconds, 0.0)))
  return f"{s // 3600}h{s // 60 % 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class Progress:
  """Counts finished units of a run of `total` and prints a line per unit.

  Args:
    total: the units the run will finish (sizes x dtypes, cases, ...).
    label: the tool's name, printed first.
    out: where the lines go (default stdout; tools keep their rows there).

  Example::

    p = Progress(12, "bench")
    for size in sizes:
      ...
      p.step(f"{size} B")   # "bench [3/12] 4096 B: 0m41s elapsed, about 2m04s left"
  """

  def __init__(self, total: int, label: str, out: TextIO | None = None):
    self.total = max(int(total), 1)
    self.label = label
    self.done = 0
    self.started = time.monotonic()
    self.out = out or sys.stdout

  def left_s(self) -> float:
    """Seconds left, estimated from the mean time per finished unit."""
    if self.done == 0:
      return float("nan")
    elapsed = time.monotonic() - self.started
    return elapsed / self.done * (self.total - self.done)

  def line(self, note: str = "") -> str:
    """The progress line for the current count."""
    elapsed = time.monotonic() - self.started
    left = self.left_s()
    eta = "?" if left != left else f"about {duration(left)} left"  # NaN: nothing done yet
    head = f"{self.label} [{self.done}/{self.total}]" + (f" {note}" if note else "")
    return f"{head}: {duration(elapsed)} elapsed, {eta}"

  def step(self, note: str = "", n: int = 1) -> str:
    """Counts `n` more finished units and prints (and returns) the line."""
    self.done = min(self.done + n, self.total)
    text = self.line(note)
    print(text, file=self.out, flush=True)
    return text
