"""The dispatch log: every decision jax_llar takes at lowering time.

A decision not to use the fast path is logged once per (reason, detail) on the
``jax_llar`` logger, and every decision is kept (the most recent 10,000) for
``jax_llar.dispatch_log()``.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading

logger = logging.getLogger("jax_llar")

_lock = threading.Lock()
_seen: set[tuple[str, str]] = set()
_records: collections.deque = collections.deque(maxlen=10_000)


@dataclasses.dataclass(frozen=True)
class Decision:
  """One lowering decision.

  Attributes:
    impl: ``"llar.one_shot_ll"`` or ``"lax.psum"``.
    reason: short category: ``"fast_path"``, ``"platform"``, ``"dtype"``,
      ``"size"``, ``"empty"``, ``"world_size"``, ``"mesh"``, ``"multiprocess"``,
      ``"extension"``, ``"communicator"``, ``"disabled"``,
      ``"axis_index_groups"``, ``"positional_axes"``.
    detail: human-readable explanation.
    axes: reduced mesh axes.
    dtype: element dtype name.
    bytes_per_rank: payload bytes per rank.
    world_size: ranks per replica group (0 when the decision was taken before
      the groups were formed: platform, dtype, empty, disabled, mesh).
    comm_id: communicator-set id for the fast path, else 0.
    comm_key: fingerprint of that set's device groups, else 0.
  """
  impl: str
  reason: str
  detail: str
  axes: tuple
  dtype: str
  bytes_per_rank: int
  world_size: int = 0
  comm_id: int = 0
  comm_key: int = 0

  @property
  def fast(self) -> bool:
    """True when the psum runs on a jax_llar kernel."""
    return self.impl != "lax.psum"


def record(d: Decision, *, level: int = logging.WARNING) -> Decision:
  """Stores `d`; logs it once per (reason, detail) when it is a fallback."""
  with _lock:
    _records.append(d)
    key = (d.reason, d.detail)
    first = key not in _seen
    _seen.add(key)
  if first and not d.fast:
    logger.log(level, "jax_llar: psum over %s (%s, %d bytes per rank) uses "
               "lax.psum: %s", d.axes, d.dtype, d.bytes_per_rank, d.detail)
  return d


def log_once(key: str, message: str, level: int = logging.WARNING) -> None:
  with _lock:
    first = ("message", key) not in _seen
    _seen.add(("message", key))
  if first:
    logger.log(level, "%s", message)


def dispatch_log() -> list[Decision]:
  """Returns the recorded decisions (at most the last 10,000), oldest first.

  One entry per lowering of a psum. JAX lowers identical psums of one program
  (same shape, dtype and axes) once, so a program can hold more all-reduces
  than it has entries here.
  """
  with _lock:
    return list(_records)


def clear_dispatch_log() -> None:
  """Forgets recorded decisions and which fallbacks were already logged."""
  with _lock:
    _records.clear()
    _seen.clear()
