"""The dispatch policy: which algorithm, if any, serves a psum.

Pure: a function of the payload (dtype, bytes per rank), the number of ranks
of the replica groups, the size cap, the forced algorithm and the tuning
table. It does not look at devices, files, the extension, the environment
or the log; ``jax_llar.lowering`` gathers those facts (the table for the
devices' architecture and number of ranks comes from ``jax_llar.tuning``),
asks `choose`, and then checks the environment.

A tuning table (`TuningTable`) holds, for one GPU architecture and one
number of ranks, ordered rows ``(max_bytes, algorithm)``: a payload of n
bytes per rank goes to the first row with n <= max_bytes, and above the last
row to lax.psum. Where no table exists for the devices and number of ranks,
the default rule decides: `DEFAULT_ALGORITHM` up to its MAX_BYTES. The
tables record the measurement behind them (``jax_llar/tuning/``).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping

import numpy as np

from jax_llar.algorithms import (MAX_BYTES, MAX_RANKS, NON_DETERMINISTIC, SUPPORTED_DTYPES,
                                 Algorithm, dtype_refusal)

# The reasons `choose` gives, in the order it checks them. "fast_path" means
# an algorithm was chosen; "table" that the tuning table chose lax.psum for
# this size (a lax.psum row).
REASONS = ("dtype", "empty", "mesh", "world_size", "size", "table", "fast_path")

# The algorithm of the default rule, used up to its MAX_BYTES where no tuning
# table exists for the architecture and number of ranks.
DEFAULT_ALGORITHM = Algorithm.ONE_SHOT_LL

# The name a table row gives lax.psum.
LAX_PSUM = "lax.psum"

# Architecture names: "sm_" and the compute capability's major and minor
# digits (compute capability 9.0 is "sm_90", 10.0 "sm_100").
ARCHITECTURE_PATTERN = re.compile(r"sm_[1-9][0-9]{1,2}")


@dataclasses.dataclass(frozen=True)
class TableRow:
  """One row of a tuning table: payloads up to `max_bytes` bytes per rank
  (and above the previous row's) go to `algorithm`.

  Attributes:
    max_bytes: largest payload per rank of the row, bytes (> 0).
    algorithm: the algorithm, or None for lax.psum.
  """
  max_bytes: int
  algorithm: Algorithm | None

  @property
  def name(self) -> str:
    """The algorithm's short name, or ``"lax.psum"``."""
    return self.algorithm.short_name if self.algorithm is not None else LAX_PSUM


@dataclasses.dataclass(frozen=True)
class TuningTable:
  """The measured dispatch for one GPU architecture and number of ranks.

  Attributes:
    architecture: e.g. ``"sm_90"`` (compute capability 9.0).
    ranks: ranks per replica group, 2 .. MAX_RANKS.
    rows: in increasing `max_bytes`; a payload of n bytes per rank goes to
      the first row with n <= max_bytes, above the last row to lax.psum.
      No two neighbouring rows name the same implementation, and the last
      row is not lax.psum (both would be rows that change nothing). No row
      names an algorithm of NON_DETERMINISTIC: a table chooses only
      algorithms whose output is bitwise the rank-order reference (those are
      run only when forced, JAX_LLAR_ALGORITHM).
    source: where the table was read from (a path), for messages.
    provenance: how the table was made (``jax_llar.tuning`` documents the
      keys); not used by the policy.

  Raises:
    ValueError: a row breaks one of the rules above, names a
      non-deterministic algorithm, or a row's max_bytes exceeds its
      algorithm's MAX_BYTES; the message names the row.

  Example::

    >>> t = TuningTable("sm_90", 2, (TableRow(262144, Algorithm.ONE_SHOT_LL),))
    >>> t.row_for(1024)
    (0, TableRow(max_bytes=262144, algorithm=Algorithm.ONE_SHOT_LL))
    >>> t.row_for(262145) is None
    True
  """
  architecture: str
  ranks: int
  rows: tuple[TableRow, ...]
  source: str = ""
  provenance: Mapping[str, Any] = dataclasses.field(default_factory=dict,
                                                    compare=False)

  def __post_init__(self):
    if not isinstance(self.architecture, str) or not ARCHITECTURE_PATTERN.fullmatch(
        self.architecture):
      raise ValueError(f"architecture must look like 'sm_90', got {self.architecture!r}")
    if (not isinstance(self.ranks, int) or isinstance(self.ranks, bool)
        or not 2 <= self.ranks <= MAX_RANKS):
      raise ValueError(f"ranks must be an int in 2..{MAX_RANKS}, got {self.ranks!r}")
    previous = None
    for i, row in enumerate(self.rows):
      where = f"row {i + 1}"
      if not isinstance(row, TableRow):
        raise ValueError(f"{where} is not a TableRow: {row!r}")
      if (not isinstance(row.max_bytes, int) or isinstance(row.max_bytes, bool)
          or row.max_bytes <= 0):
        raise ValueError(f"{where}: max_bytes must be a positive int, got {row.max_bytes!r}")
      if row.algorithm is not None and not isinstance(row.algorithm, Algorithm):
        raise ValueError(f"{where}: algorithm must be an Algorithm or None, got "
                         f"{row.algorithm!r}")
      if row.algorithm in NON_DETERMINISTIC:
        raise ValueError(f"{where}: {row.name} is not deterministic (floating-point "
                         "atomics add in arrival order), so no tuning table may choose "
                         "it; force it with JAX_LLAR_ALGORITHM")
      if row.algorithm is not None and row.max_bytes > MAX_BYTES[row.algorithm]:
        raise ValueError(f"{where}: max_bytes {row.max_bytes} is above "
                         f"{MAX_BYTES[row.algorithm]}, the most {row.name} serves")
      if previous is not None:
        if row.max_bytes <= previous.max_bytes:
          raise ValueError(f"{where}: max_bytes {row.max_bytes} is not above row "
                           f"{i}'s {previous.max_bytes} (rows must be sorted)")
        if row.algorithm == previous.algorithm:
          raise ValueError(f"rows {i} and {i + 1} both choose {row.name}: merge them")
      previous = row
    if self.rows and self.rows[-1].algorithm is None:
      raise ValueError(f"row {len(self.rows)}, the last, chooses lax.psum, which "
                       "every size above the last row gets anyway: drop it")

  @property
  def label(self) -> str:
    """``"sm_90 x 2 ranks"``."""
    return f"{self.architecture} x {self.ranks} ranks"

  def row_for(self, bytes_per_rank: int) -> tuple[int, TableRow] | None:
    """(index, row) of the row that serves `bytes_per_rank`, or None above
    the last row."""
    for i, row in enumerate(self.rows):
      if bytes_per_rank <= row.max_bytes:
        return i, row
    return None

  def describe_row(self, index: int) -> str:
    """``"row 1 of the tuning table for sm_90 x 2 ranks (up to 262144 bytes
    per rank: one_shot_ll; <source>)"``."""
    row = self.rows[index]
    low = self.rows[index - 1].max_bytes + 1 if index else 1
    src = f"; {self.source}" if self.source else ""
    return (f"row {index + 1} of the tuning table for {self.label} ({low} to "
            f"{row.max_bytes} bytes per rank: {row.name}{src})")


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


def choose(dtype, bytes_per_rank: int, num_ranks: int, *, max_bytes: int,
           table: TuningTable | None = None, force: Algorithm | None = None,
           no_table: str = "no tuning table") -> Choice:
  """Chooses the algorithm for an all-reduce of `bytes_per_rank` bytes of
  `dtype` on each of `num_ranks` ranks, or says why lax.psum serves it.

  The reasons are checked in this order, so that the first one says what
  matters most for the psum itself:
    "dtype"       `dtype` is not float32, bfloat16, float16 or int32;
    "empty"       no payload (`bytes_per_rank` is 0);
    "mesh"        the number of ranks is unknown (`num_ranks` is 0: the
                  lowering saw no concrete mesh);
    "world_size"  fewer than 2 or more than MAX_RANKS ranks;
    "size"        more than `max_bytes` bytes per rank (the user's cap), or
                  more than the forced algorithm serves, or above the last
                  row of `table`, or (no table) more than the default rule's
                  algorithm serves;
    "table"       `table`'s row for this size is lax.psum;
    "dtype"       (again, after the size) the forced algorithm does not
                  serve `dtype` (``algorithms.dtype_refusal``:
                  one_shot_sentinel and int32), or neither the algorithm of
                  `table`'s row nor DEFAULT_ALGORITHM does (a row's algorithm
                  that refuses the dtype gives way to DEFAULT_ALGORITHM
                  where that serves the size);
    "fast_path"   the forced algorithm, else the algorithm of `table`'s row
                  for this size, else (no table) DEFAULT_ALGORITHM.
  The detail of a decision by the table names the row (`describe_row`); a
  decision by the default rule says `no_table` and "default rule".

  Args:
    dtype: element type (anything ``np.dtype`` accepts; other objects, such
      as JAX's extended dtypes, give "dtype").
    bytes_per_rank: payload of one rank, bytes (>= 0).
    num_ranks: ranks per replica group; 0 when unknown.
    max_bytes: the user's cap on bytes per rank (``settings.max_bytes``).
    table: the tuning table for the devices' architecture and `num_ranks`
      (``jax_llar.table_lookup.lookup``), or None: the default rule.
    force: an algorithm to use instead of the table's choice wherever it
      can serve the psum (``settings.algorithm``, ``JAX_LLAR_ALGORITHM``);
      its own size limit (MAX_BYTES) and `max_bytes` still apply.
    no_table: why there is no table, for the detail of a default-rule
      decision (e.g. "no tuning table for sm_90 x 4 ranks").

  Returns:
    A Choice; never raises for an unsupported psum.

  Raises:
    ValueError: `bytes_per_rank`, `num_ranks` or `max_bytes` is negative, or
      `table` is for another number of ranks than `num_ranks`.

  Example::

    >>> choose(np.float32, 1024, 2, max_bytes=4194304).algorithm
    Algorithm.ONE_SHOT_LL
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
  if table is not None and table.ranks != num_ranks:
    raise ValueError(f"the tuning table for {table.label} was given for a psum "
                     f"over {num_ranks} ranks")
  if bytes_per_rank > max_bytes:
    return Choice(None, "size", f"more than {max_bytes} bytes per rank (the "
                  "size cap, JAX_LLAR_MAX_BYTES)")
  if force is not None:
    if bytes_per_rank > MAX_BYTES[force]:
      return Choice(None, "size", f"more than {MAX_BYTES[force]} bytes per "
                    f"rank, the most {force.short_name} serves (forced by "
                    "JAX_LLAR_ALGORITHM)")
    refusal = dtype_refusal(force, dt)
    if refusal is not None:
      return Choice(None, "dtype", f"{refusal} (forced by JAX_LLAR_ALGORITHM)")
    return Choice(force, "fast_path", f"{force.short_name} over {num_ranks} "
                  "ranks (forced by JAX_LLAR_ALGORITHM)")
  if table is None:
    default = DEFAULT_ALGORITHM
    if bytes_per_rank > MAX_BYTES[default]:
      return Choice(None, "size", f"more than {MAX_BYTES[default]} bytes per "
                    f"rank, the most {default.short_name} serves ({no_table}: "
                    "default rule)")
    return Choice(default, "fast_path", f"{default.short_name} over {num_ranks} "
                  f"ranks ({no_table}: default rule)")
  found = table.row_for(bytes_per_rank)
  if found is None:
    src = f" ({table.source})" if table.source else ""
    if not table.rows:
      return Choice(None, "size", f"the tuning table for {table.label} chooses "
                    f"lax.psum at every size{src}")
    return Choice(None, "size", f"more than {table.rows[-1].max_bytes} bytes per "
                  f"rank, the last row of the tuning table for {table.label}{src}")
  index, row = found
  if row.algorithm is None:
    return Choice(None, "table", f"lax.psum by {table.describe_row(index)}")
  refusal = dtype_refusal(row.algorithm, dt)
  if refusal is not None:
    # The row's algorithm does not take this dtype (the table was measured on
    # others): the default algorithm serves it where it can, as it would
    # without a table.
    default = DEFAULT_ALGORITHM
    if bytes_per_rank <= MAX_BYTES[default] and dtype_refusal(default, dt) is None:
      return Choice(default, "fast_path", f"{default.short_name} over {num_ranks} "
                    f"ranks: {refusal} ({table.describe_row(index)}), default rule")
    return Choice(None, "dtype", f"{refusal} (chosen by {table.describe_row(index)})")
  return Choice(row.algorithm, "fast_path", f"{row.algorithm.short_name} over "
                f"{num_ranks} ranks by {table.describe_row(index)}")
