"""The dispatch policy: which algorithm, if any, serves a psum.

Pure: a function of the payload (dtype, bytes per rank), the number of ranks
of the replica groups, the size cap and the tuning table. It does not look at
devices, the extension, the environment or the log; ``jax_llar.lowering``
gathers those facts, asks `choose`, and then checks the environment.

The tuning table maps (number of ranks, bytes per rank) to an algorithm. Each
entry carries the source of its rule, so that a threshold is never a literal
without the measurement behind it.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from jax_llar.algorithms import (MAX_BYTES, MAX_RANKS, SUPPORTED_DTYPES,
                                 Algorithm)

# The reasons `choose` gives, in the order it checks them. "fast_path" means
# an algorithm was chosen.
REASONS = ("dtype", "empty", "mesh", "world_size", "size", "fast_path")


@dataclasses.dataclass(frozen=True)
class TuningEntry:
  """Use `algorithm` for min_ranks <= ranks <= max_ranks and payloads of at
  most `max_bytes` bytes per rank.

  Attributes:
    algorithm: the kernel.
    min_ranks, max_ranks: number of ranks of a replica group, inclusive.
    max_bytes: largest payload per rank (bytes) for this entry; at most the
      algorithm's MAX_BYTES.
    source: where the rule comes from (a measurement, or why there is none).
  """
  algorithm: Algorithm
  min_ranks: int
  max_ranks: int
  max_bytes: int
  source: str


TUNING_TABLE: tuple[TuningEntry, ...] = (
    TuningEntry(
        Algorithm.ONE_SHOT_LL, 2, 2, MAX_BYTES[Algorithm.ONE_SHOT_LL],
        "measured on 2 x H200 (NVLink) with jax 0.11.2 and NCCL 2.28.9: "
        "faster than lax.psum at every size up to the one-shot limit (README, "
        "performance section; benchmarks/NOTES.md)"),
    TuningEntry(
        Algorithm.ONE_SHOT_LL, 3, MAX_RANKS, MAX_BYTES[Algorithm.ONE_SHOT_LL],
        "not measured (no machine with more than 2 GPUs lent yet): the "
        "2-rank limit"),
)


@dataclasses.dataclass(frozen=True)
class Choice:
  """What the policy chose for one psum.

  Attributes:
    algorithm: the algorithm, or None for lax.psum.
    reason: one of REASONS: "fast_path" when `algorithm` is set, else why not.
    detail: a sentence for the user.
  """
  algorithm: Algorithm | None
  reason: str
  detail: str


def _dtype_or_none(dtype) -> np.dtype | None:
  try:
    return np.dtype(dtype)
  except TypeError:  # e.g. JAX's extended dtypes (PRNG keys)
    return None


def entry_for(num_ranks: int, bytes_per_rank: int,
              table: Sequence[TuningEntry] = TUNING_TABLE) -> TuningEntry | None:
  """The first entry of `table` that covers `num_ranks` and `bytes_per_rank`."""
  for e in table:
    if e.min_ranks <= num_ranks <= e.max_ranks and bytes_per_rank <= e.max_bytes:
      return e
  return None


def choose(dtype, bytes_per_rank: int, num_ranks: int, *, max_bytes: int,
           table: Sequence[TuningEntry] = TUNING_TABLE,
           force: Algorithm | None = None) -> Choice:
  """Chooses the algorithm for an all-reduce of `bytes_per_rank` bytes of
  `dtype` on each of `num_ranks` ranks, or says why lax.psum serves it.

  The reasons are checked in this order, so that the first one says what
  matters most for the psum itself:
    "dtype"       `dtype` is not float32, bfloat16, float16 or int32;
    "empty"       no payload (`bytes_per_rank` is 0);
    "mesh"        the number of ranks is unknown (`num_ranks` is 0: the
                  lowering saw no concrete mesh);
    "world_size"  fewer than 2 or more than MAX_RANKS ranks;
    "size"        more than `max_bytes` bytes per rank, or no entry of
                  `table` covers (num_ranks, bytes_per_rank), or more
                  than the forced algorithm serves;
    "fast_path"   the forced algorithm, else the first covering entry's.

  Args:
    dtype: element type (anything ``np.dtype`` accepts; other objects, such
      as JAX's extended dtypes, give "dtype").
    bytes_per_rank: payload of one rank, bytes (>= 0).
    num_ranks: ranks per replica group; 0 when unknown.
    max_bytes: the user's cap on bytes per rank (``settings.max_bytes``).
    table: the tuning table (default: TUNING_TABLE).
    force: an algorithm to use instead of the table's choice wherever it
      can serve the psum (``settings.algorithm``, ``JAX_LLAR_ALGORITHM``);
      its own size limit (MAX_BYTES) and `max_bytes` still apply.

  Returns:
    A Choice; never raises for an unsupported psum.

  Raises:
    ValueError: `bytes_per_rank`, `num_ranks` or `max_bytes` is negative.
  """
  if bytes_per_rank < 0 or num_ranks < 0 or max_bytes < 0:
    raise ValueError(f"negative input: bytes_per_rank={bytes_per_rank}, "
                     f"num_ranks={num_ranks}, max_bytes={max_bytes}")
  dt = _dtype_or_none(dtype)
  if dt is None or dt not in SUPPORTED_DTYPES:
    return Choice(None, "dtype", f"dtype {dtype} is not one of "
                  f"{', '.join(map(str, SUPPORTED_DTYPES))}")
  if bytes_per_rank == 0:
    return Choice(None, "empty", "empty array")
  if num_ranks == 0:
    return Choice(None, "mesh", "number of ranks unknown: no concrete mesh at "
                  "lowering time (use jax.shard_map with a jax.sharding.Mesh, "
                  "or jax.set_mesh)")
  if num_ranks < 2:
    return Choice(None, "world_size",
                  "a replica group of one device needs no reduction")
  if num_ranks > MAX_RANKS:
    return Choice(None, "world_size", f"replica groups of {num_ranks} devices "
                  f"exceed the {MAX_RANKS} the kernels serve")
  if bytes_per_rank > max_bytes:
    return Choice(None, "size", f"more than {max_bytes} bytes per rank (the "
                  "size cap, JAX_LLAR_MAX_BYTES)")
  if force is not None:
    if bytes_per_rank > MAX_BYTES[force]:
      return Choice(None, "size", f"more than {MAX_BYTES[force]} bytes per "
                    f"rank, the most {force.short_name} serves (forced by "
                    "JAX_LLAR_ALGORITHM)")
    return Choice(force, "fast_path", f"{force.short_name} over {num_ranks} "
                  "ranks (forced by JAX_LLAR_ALGORITHM)")
  entry = entry_for(num_ranks, bytes_per_rank, table)
  if entry is None:
    return Choice(None, "size", f"no tuning entry for {num_ranks} ranks and "
                  f"{bytes_per_rank} bytes per rank")
  return Choice(entry.algorithm, "fast_path",
                f"{entry.algorithm.short_name} over {num_ranks} ranks")
