"""The dispatch log: every decision jax_llar takes for a psum.

A decision not to use the fast path is logged once per (reason, detail) on
the ``jax_llar`` logger, and every decision is kept (the most recent 10,000)
for ``jax_llar.dispatch_log()``.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
from typing import Any

from jax_llar.algorithms import Algorithm

# The library's logger: each fallback reason once per (reason, detail), at
# WARNING for an explicit jax_llar.psum and at INFO for the swaps' psums.
logger = logging.getLogger("jax_llar")

_lock = threading.Lock()
_seen: set[tuple[str, str]] = set()
_records: collections.deque = collections.deque(maxlen=10_000)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Decision:
  """How one psum is lowered, and the facts the choice was made from.

  The facts (axes, dtype, bytes_per_rank, world_size) are recorded whatever
  the reason, so a decision taken on CPU tells what a GPU would do: there
  `candidate` is the algorithm the policy chose and `reason` names what in
  this environment refused it.

  Attributes:
    reason: ``"fast_path"``, or why lax.psum serves the psum. Payload
      reasons (``jax_llar.policy``): ``"dtype"``, ``"empty"``, ``"mesh"``,
      ``"world_size"``, ``"size"``, ``"table"`` (the tuning table's row
      for the size is lax.psum; the detail names the row, as it does for a
      fast path the table chose); environment reasons
      (``jax_llar.lowering``, checked after them): ``"disabled"``,
      ``"export"``, ``"xla_flags"``, ``"platform"``, ``"multiprocess"``,
      ``"extension"``, ``"communicator"``; psums that only JAX lowers,
      checked first: ``"axis_index_groups"``, ``"positional_axes"``,
      ``"symbolic_shape"``; after the policy: ``"architecture"`` (the
      devices of the groups differ in architecture, so no one tuning table
      applies), ``"shape"`` (the fused kernel's shape rule) and
      ``"partial_manual"`` (a shard_map that leaves mesh axes automatic).
    detail: a sentence for the user; for an environment reason it also says
      what would apply on CUDA GPUs that are NVLink peers.
    axes: the reduced axis names.
    dtype: element dtype name, e.g. ``"bfloat16"``.
    bytes_per_rank: payload per rank, bytes.
    world_size: number of ranks of each replica group; 0 when unknown (no
      concrete mesh at lowering time).
    algorithm: the algorithm that runs the psum, or None (lax.psum).
    candidate: what the policy chose for the psum itself, whether or not the
      environment let it run; None when a payload reason refused it.
    comm_id: communicator-set id of the fast path, else 0.
    comm_key: fingerprint of that set's device groups, else 0.
    source: who requested the fast path: ``"psum"`` (``jax_llar.psum``
      and ``jax_llar.psum_add_rms_norm``), ``"swap"``
      (``jax_llar.swap_psum``) or ``"install"`` (the process-wide swap).
    op: ``"psum"``, or ``"psum_add_rms_norm"`` for the fused op (its
      fast path is the fused kernel, its fallback the unfused code).
  """
  reason: str
  detail: str
  axes: tuple
  dtype: str
  bytes_per_rank: int
  world_size: int
  algorithm: Algorithm | None = None
  candidate: Algorithm | None = None
  comm_id: int = 0
  comm_key: int = 0
  source: str = "psum"
  op: str = "psum"

  @property
  def fast(self) -> bool:
    """True when the psum runs on a jax_llar kernel."""
    return self.algorithm is not None

  @property
  def impl(self) -> str:
    """``"llar.<algorithm>"`` on the fast path (with ``+add_rms_norm`` for
    the fused kernel), else ``"lax.psum"`` (for the fused op: its unfused
    code, ``"reference"``)."""
    if self.algorithm is None:
      return "reference" if self.op != "psum" else "lax.psum"
    return self.algorithm.impl + ("+add_rms_norm" if self.op != "psum" else "")

  def to_dict(self) -> dict[str, Any]:
    """JSON-ready dict: every field (algorithms by short name, axes as a
    list), plus ``impl`` and ``fast``."""
    d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
    d["axes"] = list(self.axes)
    for k in ("algorithm", "candidate"):
      d[k] = d[k].short_name if d[k] is not None else None
    d["impl"] = self.impl
    d["fast"] = self.fast
    return d

  def __repr__(self) -> str:
    fields = ", ".join(f"{f.name}={getattr(self, f.name)!r}"
                       for f in dataclasses.fields(self))
    return f"Decision(impl={self.impl!r}, {fields})"


def record(d: Decision, *, level: int = logging.WARNING) -> Decision:
  """Stores `d`; logs it at `level` once per (reason, detail) unless it is
  the fast path. Returns `d`."""
  with _lock:
    _records.append(d)
    # Keyed with the level: a refusal logged at INFO for a swapped psum is
    # logged again as a WARNING for an explicit one.
    key = (d.reason, d.detail, level)
    first = key not in _seen
    _seen.add(key)
  if first and not d.fast:
    fallback = "its unfused code" if d.op != "psum" else "lax.psum"
    ranks = f"{d.world_size} ranks" if d.world_size else "ranks not known"
    logger.log(level, "jax_llar: %s over %s (%s, %d bytes per rank, %s) uses %s: %s",
               d.op, d.axes, d.dtype, d.bytes_per_rank, ranks, fallback, d.detail)
  return d


def log_once(key: str, message: str, level: int = logging.WARNING) -> None:
  """Logs `message` on the ``jax_llar`` logger the first time `key` is seen
  (again after ``clear_dispatch_log()``)."""
  with _lock:
    first = ("message", key) not in _seen
    _seen.add(("message", key))
  if first:
    logger.log(level, "%s", message)


def dispatch_log() -> list[Decision]:
  """Returns the recorded decisions (at most the last 10,000), oldest first.

  One entry per operand of each psum equation requested for the fast path
  (``jax_llar.psum``, ``swap_psum``, ``install``), each time a program is
  lowered; psums nobody requested are not recorded. A program lowered
  again (another shape, a cache miss) adds entries again. A
  ``jax_llar.psum_add_rms_norm`` has one entry (``op="psum_add_rms_norm"``);
  lowered for CUDA where the fused kernel refuses, a second one follows for
  the psum of the unfused code it runs instead (``op="psum"``), which may
  take a fast path of its own.
  """
  with _lock:
    return list(_records)


def clear_dispatch_log() -> None:
  """Forgets recorded decisions and which messages were already logged."""
  with _lock:
    _records.clear()
    _seen.clear()
