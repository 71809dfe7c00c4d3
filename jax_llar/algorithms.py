"""The all-reduce algorithms of jax_llar and their limits.

Each algorithm is one CUDA kernel of the extension (``ffi/src/kernels/``),
named by its decomposition; its integer id is the FFI attribute
``algorithm`` that the execute handler uses to pick the launcher. The ids and
limits here must equal the extension's (``ffi/include/llar/args.h``; the
module ``jax_llar._llar`` exports them as ``ALGORITHMS``, ``MAX_BYTES`` and
``MAX_RANKS``): ``tests/test_layout.py`` compares them with the C++ source and
``jax_llar._ext`` refuses to use an extension whose values differ.

Algorithms:
  ONE_SHOT_LL (1): every rank stores its payload, packed in 16-byte LL lines
    ``{d0, flag, d1, flag}`` (the flag: the call's signature and the epoch's
    low 16 bits, `SIGNED`), into every rank's symmetric scratch, then
    polls its own scratch for the peers' lines and reduces the ranks in rank
    order; no barrier at entry or exit (arXiv 2607.16100, section 4.1; the LL
    protocol of NCCL). Payload per rank: up to 64 blocks x 512 lines x 8 bytes.
  TWO_SHOT_LL (2): reduce-scatter, then all-gather, both in LL lines: rank q
    owns chunk q of the payload (chunks as equal as possible, `two_shot_chunk`),
    every rank stores its lines of chunk q into q's scratch, q reduces its
    chunk in rank order (bitwise the one-shot's result) and stores the reduced
    lines into every rank's scratch; no barrier, double buffered by epoch
    parity (ffi/src/kernels/two_shot_ll.cuh). Payload per rank: up to 4 MiB.
    The shipped sm_90 x 2 table chooses it above the one-shot's sizes;
    JAX_LLAR_ALGORITHM=two_shot_ll forces it.
  ONE_SHOT_SENTINEL (3): the one-shot with full-width lines: every 16-byte
    store carries 16 payload bytes and no flag, into a slot of every rank's
    scratch that holds a sentinel (all ones) until the line lands; the reader
    polls until neither 8-byte word is the sentinel, reduces in rank order
    (the one-shot LL's additions: its result bit for bit, but that every NaN
    result is the canonical NaN, float32 0x7fffffff, 16-bit 0x7fff), and
    re-arms the slots itself; double buffered by epoch parity, no barrier
    (arXiv 2607.16100, section 4; ffi/include/llar/sentinel.cuh,
    ffi/src/kernels/one_shot_sentinel.cuh). A payload word equal to the
    sentinel (all-ones NaNs) is sent with the quiet bit of its lowest element
    cleared. Half the bytes of the LL on the wire; float32, bfloat16 and float16
    only (`dtype_refusal`: an int32 word of all ones, -1 twice, cannot be
    changed without changing the sum). Payload per rank: up to 64 blocks x
    512 lines x 16 bytes. Its lines carry no call signature (no flag word:
    not in `SIGNED`). Not in the tuning table yet; reachable with
    JAX_LLAR_ALGORITHM=one_shot_sentinel.
  ONE_SHOT_LL128 (4): the one-shot in NCCL's LL128 line format: 128-byte
    lines of 120 payload bytes and an 8-byte flag word, each stored by 8 lanes
    of a warp with one 16-byte vector store apiece, polled by the reader with
    the same lane mapping; reduces in rank order (bitwise the one-shot LL's
    result); double buffered by epoch parity with its own epoch counters, no
    barrier (ffi/include/llar/ll128.cuh, ffi/src/kernels/one_shot_ll128.cuh).
    Correct only if a warp's 128-byte store reaches the reader as one unit: a
    property of the hardware that no documentation promises, tested by
    ``python -m jax_llar.tools.store_atomicity`` (benchmarks/NOTES.md records
    each run). 15/16 of the bytes on the wire are payload (the LL's 1/2).
    Payload per rank: up to 64 blocks x 64 lines x 120 bytes. Not in the
    tuning table yet; reachable with JAX_LLAR_ALGORITHM=one_shot_ll128.
  NCCL_LLA2A_ONE_SHOT (5): the one-shot written on NCCL's LL all-to-all
    device session (``ncclLLA2ASession``, NCCL 2.28 device API), the
    reference the paper's one-shot builds on: each thread broadcasts its
    8-byte line through the session into a slot of every rank's session
    buffer, receives one slot per rank and reduces them in rank order
    (``recvReduce`` with the one-shot's accumulation: bitwise the one-shot
    LL's result); the one-shot LL's grid. The buffer is NCCL's (a device
    communicator created with ``ncclLLA2ACreateRequirement``), not a scratch
    region of jax_llar's. NCCL's receive polls without a time bound (NCCL
    2.28; later versions only poll an abort flag); a watchdog warp per block
    bounds it with the library's timeout, report and trap
    (ffi/src/kernels/nccl_lla2a_one_shot.cuh). Needs distinct GPUs: the
    one-GPU loopback harness refuses it. Its lines carry NCCL's flags, no
    call signature (not in `SIGNED`). Payload per rank: up to 64 blocks x
    512 lines x 8 bytes. Not in the shipped tuning table (``tune`` measures
    it with the others); reachable with JAX_LLAR_ALGORITHM=nccl_lla2a_one_shot,
    and measured by the kernel level as ``nccl.lla2a_one_shot``.
  TWO_SHOT_LL128 (6): the two-shot of TWO_SHOT_LL in the LL128 line format of
    ONE_SHOT_LL128 (same phases, chunks counted in 120-byte lines, bitwise
    the one-shot LL's result), with the same dependence on 128-byte stores
    arriving as one unit (ffi/src/kernels/two_shot_ll128.cuh). Payload per
    rank: up to 4 MiB. Not in the tuning table; reachable with
    JAX_LLAR_ALGORITHM=two_shot_ll128.
  TWO_SHOT_LL128_ATOMIC (7): the two-shot LL128 whose reduce-scatter adds
    every rank's lines into the chunk owner's zeroed accumulator with
    ``red.global.add`` (float32 accumulation for the float dtypes, 16-bit
    elements widened; int32 adds), each rank then setting its bit in a
    per-line arrival mask after a release fence; the owner waits (bounded)
    for every peer's bit, adds its own values, zeroes the accumulator for
    reuse two calls later, and all-gathers the result in LL128 lines
    (arXiv 2607.16100, section 4; ffi/src/kernels/two_shot_ll128_atomic.cuh).
    NOT DETERMINISTIC (`NON_DETERMINISTIC`): floating-point atomics add in
    arrival order, so the float results may change from run to run and need
    not be bitwise the rank-order reference; every rank gets the same bits,
    int32 is exact, and each float element is within the bound
    ``jax_llar.testing.atomic_sum_violations`` checks. Opt-in only: no tuning
    table chooses it; reachable with JAX_LLAR_ALGORITHM=two_shot_ll128_atomic.
    Payload per rank: up to 4 MiB.
"""

from __future__ import annotations

import enum

import ml_dtypes
import numpy as np


class Algorithm(enum.IntEnum):
  """An all-reduce kernel of the extension; the value is its FFI id.

  ``int(algorithm)`` is the ``algorithm`` attribute of the custom call
  ``jax_llar_all_reduce``.

  Example::

    >>> Algorithm.ONE_SHOT_LL.short_name, Algorithm.ONE_SHOT_LL.impl
    ('one_shot_ll', 'llar.one_shot_ll')
  """
  ONE_SHOT_LL = 1
  TWO_SHOT_LL = 2
  ONE_SHOT_SENTINEL = 3
  ONE_SHOT_LL128 = 4
  NCCL_LLA2A_ONE_SHOT = 5
  TWO_SHOT_LL128 = 6
  TWO_SHOT_LL128_ATOMIC = 7

  @property
  def short_name(self) -> str:
    """The lower-case name: the extension's key and the tools' spelling."""
    return self.name.lower()

  @property
  def impl(self) -> str:
    """The implementation label used in logs and results, ``llar.<name>``."""
    return f"llar.{self.short_name}"

  @classmethod
  def from_short_name(cls, short_name: str) -> Algorithm:
    """The algorithm whose `short_name` is `short_name`.

    Raises:
      ValueError: no algorithm has that name (the message lists them).
    """
    for a in cls:
      if a.short_name == short_name:
        return a
    raise ValueError(f"unknown algorithm {short_name!r}; known: "
                     f"{', '.join(a.short_name for a in cls)}")

  def __repr__(self) -> str:
    return f"Algorithm.{self.name}"

  def __str__(self) -> str:
    """The short name (an IntEnum would print its number): what a
    decision's ``str(d.candidate)`` and an f-string show."""
    return self.short_name


# Largest number of ranks of one replica group that the kernels serve
# (args.h: kMaxRanks; the kernel argument block and the device communicator
# hold this many peer addresses).
MAX_RANKS = 16

# Largest payload per rank, in bytes, that each algorithm's scratch holds
# (args.h: kOneShotMaxBytes = kMaxBlocks * kLinesPerBlock * kPayloadBytesPerLine;
# kTwoShotMaxBytes; kOneShotSentinelMaxBytes = kMaxBlocks * kLinesPerBlock *
# kLineBytes; kOneShotLL128MaxBytes = kMaxBlocks * kLL128LinesPerBlock *
# kLL128PayloadBytes; kNcclLLA2AOneShotMaxBytes = kOneShotMaxBytes).
MAX_BYTES: dict[Algorithm, int] = {
    Algorithm.ONE_SHOT_LL: 64 * 512 * 8,
    Algorithm.TWO_SHOT_LL: 4 * 1024 * 1024,
    Algorithm.ONE_SHOT_SENTINEL: 64 * 512 * 16,
    Algorithm.ONE_SHOT_LL128: 64 * 64 * 120,
    Algorithm.NCCL_LLA2A_ONE_SHOT: 64 * 512 * 8,
    Algorithm.TWO_SHOT_LL128: 4 * 1024 * 1024,
    Algorithm.TWO_SHOT_LL128_ATOMIC: 4 * 1024 * 1024,
}

# The algorithms whose float results depend on the order in which
# contributions arrive (floating-point atomics), so may differ from run to
# run and from the rank-order reference: a tuning table never chooses them
# (``jax_llar.policy.TuningTable`` refuses such a row, ``jax_llar.tuning``
# leaves them out of the tables it builds and ``python -m
# jax_llar.tools.tune`` does not measure them); only JAX_LLAR_ALGORITHM (a
# forced algorithm) runs them. The rule they keep instead of bitwise
# equality: ``jax_llar.testing.atomic_sum_violations``.
NON_DETERMINISTIC: frozenset[Algorithm] = frozenset({Algorithm.TWO_SHOT_LL128_ATOMIC})

# The algorithms whose lines carry the call's signature
# (``jax_llar.signature``; ffi/include/llar/args.h: CarriesSignature, the
# extension's SIGNED): a call mispaired with another call of another
# signature ends in the foreign-signature error (``jax_llar.error_reports()``,
# code 2) or the bounded wait's timeout, never in a wrong sum. The others
# cannot carry one: ONE_SHOT_SENTINEL's lines are all payload (no flag word),
# NCCL_LLA2A_ONE_SHOT's flags are NCCL's, TWO_SHOT_LL128_ATOMIC's
# reduce-scatter adds into an accumulator (no line to check). A mispaired
# call of an unsigned algorithm can be summed with another call's data, so
# the tuning tables do not choose them unless told to
# (``jax_llar.tools.tune.tables.build_tables``, ``allow_unsigned``).
SIGNED: frozenset[Algorithm] = frozenset({
    Algorithm.ONE_SHOT_LL, Algorithm.TWO_SHOT_LL, Algorithm.ONE_SHOT_LL128,
    Algorithm.TWO_SHOT_LL128})

# The algorithms whose correctness rests on a hardware property that no
# document guarantees: LL128 lines are correct only if the 128 bytes that
# eight lanes of a warp store with one instruction reach the reader as one
# unit (ffi/include/llar/ll128.cuh). The property must be tested on the
# hardware, over the link the ranks use, before a tuning table may choose
# them: ``jax_llar.tools.tune.tables.build_tables`` leaves their rows out
# unless given a passing cross-device ``python -m jax_llar.tools.store_atomicity`` record
# (``validated_by``); forcing them with JAX_LLAR_ALGORITHM is the user's
# choice (benchmarks/NOTES.md records each store-atomicity run).
NEEDS_STORE_ATOMICITY: frozenset[Algorithm] = frozenset({
    Algorithm.ONE_SHOT_LL128, Algorithm.TWO_SHOT_LL128, Algorithm.TWO_SHOT_LL128_ATOMIC})

# The largest of MAX_BYTES: the cap of the JAX_LLAR_MAX_BYTES setting.
LARGEST_MAX_BYTES = max(MAX_BYTES.values())

# --- the two-shot's geometry (args.h, kernels.h; the C++ is the source) -----------

# Bytes of payload per LL line; lines of one two-shot step (64 blocks x 512).
LINE_PAYLOAD_BYTES = 8
TWO_SHOT_STEP_LINES = 64 * 512
TWO_SHOT_BLOCK_LINES = 64


def two_shot_chunk(lines: int, world: int, owner: int) -> tuple[int, int]:
  """(start, lines) of chunk `owner` of a payload of `lines` LL lines cut
  into `world` chunks as equal as possible (args.h: TwoShotChunkOf): the
  first ``lines % world`` chunks are one line longer."""
  base, extra = divmod(lines, world)
  return owner * base + min(owner, extra), base + (1 if owner < extra else 0)


def two_shot_max_steps(world: int) -> int:
  """Steps per thread the two-shot's scratch region holds for `world`
  ranks (args.h: TwoShotMaxSteps)."""
  lines = MAX_BYTES[Algorithm.TWO_SHOT_LL] // LINE_PAYLOAD_BYTES
  chunk = -(-lines // world)
  return -(-chunk // TWO_SHOT_STEP_LINES)


def two_shot_grid(n_bytes: int, world: int) -> tuple[int, int, int, int]:
  """(blocks, lines_per_block, threads, steps) of the two-shot kernel for
  `n_bytes` per rank over `world` ranks (kernels.h: TwoShotGridFor)."""
  lines = -(-n_bytes // LINE_PAYLOAD_BYTES)
  chunk = two_shot_chunk(lines, world, 0)[1]
  blocks = min(64, max(1, -(-chunk // TWO_SHOT_BLOCK_LINES)))
  per_block = -(-chunk // blocks)
  threads = min(512, max(32, -(-per_block // 32) * 32))
  return blocks, per_block, threads, -(-per_block // threads)


def region_bytes(algorithm: Algorithm, world: int) -> int:
  """Bytes of `algorithm`'s symmetric scratch region per rank for `world`
  ranks (args.h: RegionBytes). A communicator set allocates an algorithm's
  region the first time a lowering picks the algorithm for it
  (``CommSet.ensure``); ``jax_llar.status()`` lists the regions held.
  NCCL_LLA2A_ONE_SHOT's region is NCCL's LL all-to-all buffer, which its
  device communicator holds instead.

  Example::

    >>> region_bytes(Algorithm.ONE_SHOT_LL, 2)
    2097152
  """
  if algorithm in (Algorithm.ONE_SHOT_LL, Algorithm.ONE_SHOT_SENTINEL):  # the same slots
    return 2 * 64 * world * 512 * 16
  if algorithm == Algorithm.TWO_SHOT_LL:
    return two_shot_max_steps(world) * 2 * 2 * world * TWO_SHOT_STEP_LINES * 16
  if algorithm == Algorithm.ONE_SHOT_LL128:  # halves x blocks x ranks x lines x 128 B
    return 2 * 64 * world * 64 * 128
  if algorithm == Algorithm.TWO_SHOT_LL128:  # steps x halves x phases x ranks x 4096 x 128 B
    lines = -(-MAX_BYTES[Algorithm.TWO_SHOT_LL128] // 120)
    steps = -(-(-(-lines // world)) // (64 * 64))
    return steps * 2 * 2 * world * 64 * 64 * 128
  if algorithm == Algorithm.TWO_SHOT_LL128_ATOMIC:
    # the two-shot LL128's steps; accumulator slots (steps x halves x 4096 x
    # 256 B), then all-gather line slots (steps x halves x ranks x 4096 x 128 B)
    lines = -(-MAX_BYTES[Algorithm.TWO_SHOT_LL128_ATOMIC] // 120)
    steps = -(-(-(-lines // world)) // (64 * 64))
    return steps * 2 * 64 * 64 * 256 + steps * 2 * world * 64 * 64 * 128
  if algorithm == Algorithm.NCCL_LLA2A_ONE_SHOT:
    # NCCL's session buffer (args.h: NcclLLA2ABufferBytes): 64 sessions of
    # one epoch line and, per parity, world x 512 slots, 16 bytes each.
    return 64 * (1 + 2 * world * 512) * 16
  raise ValueError(f"no region size for {algorithm!r}")


# Element types the kernels reduce (reduce.cuh: one packing and accumulation
# rule per dtype); each algorithm serves the ones in DTYPES.
SUPPORTED_DTYPES: tuple[np.dtype, ...] = (
    np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16),
    np.dtype(np.int32))

# The element types each algorithm serves (its launcher refuses the others).
DTYPES: dict[Algorithm, tuple[np.dtype, ...]] = {
    a: SUPPORTED_DTYPES for a in Algorithm}
DTYPES[Algorithm.ONE_SHOT_SENTINEL] = SUPPORTED_DTYPES[:3]

# Why an algorithm does not serve a dtype it leaves out of DTYPES.
_DTYPE_REASONS = {
    Algorithm.ONE_SHOT_SENTINEL: (
        "one_shot_sentinel serves float32, bfloat16 and float16 only: its lines carry "
        "no flag, so an 8-byte payload word equal to the sentinel (all ones) must be "
        "changed before it is sent, which keeps a float sum (all-ones NaNs) but not an "
        "int32 sum (-1 twice)"),
}


def dtype_refusal(algorithm: Algorithm, dtype) -> str | None:
  """Why `algorithm` does not serve elements of `dtype`, or None when it does.

  Args:
    algorithm: an Algorithm.
    dtype: anything ``np.dtype`` accepts.

  Returns:
    None, or a sentence for the dispatch log.

  Example::

    >>> dtype_refusal(Algorithm.ONE_SHOT_LL, np.int32) is None
    True
    >>> dtype_refusal(Algorithm.ONE_SHOT_SENTINEL, np.int32)[:46]
    'one_shot_sentinel serves float32, bfloat16 and'
  """
  dt = np.dtype(dtype)
  if dt in DTYPES[algorithm]:
    return None
  return _DTYPE_REASONS.get(algorithm, f"{algorithm.short_name} does not serve {dt}")


# --- the fused all-reduce + residual add + RMSNorm --------------------------------
# (jax_llar.psum_add_rms_norm; ffi/src/kernels/one_shot_ll_add_rms_norm.cuh).
# The constants equal the extension's FUSED_* (checked when it loads).

# The fused op's XLA FFI target (the extension registers its handler).
FUSED_TARGET = "jax_llar_all_reduce_add_rms_norm"
# Largest payload per rank (x's bytes): the one-shot's.
FUSED_MAX_BYTES = 64 * 512 * 8
# Lines per block the grid rule aims at, and the largest (portable) cluster.
FUSED_BLOCK_LINES = 64
FUSED_MAX_CLUSTER_BLOCKS = 8
# Element types of x; the weight has x's dtype or float32.
FUSED_DTYPES: tuple[np.dtype, ...] = (
    np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16))


def add_rms_norm_grid(rows: int, d: int, itemsize: int):
  """The fused kernel's grid for `rows` rows of `d` elements of `itemsize`
  bytes, as the kernel's launcher computes it (AddRmsNormGridFor), or None
  where the kernel does not serve the shape.

  Each row is held by one thread block cluster of cluster_blocks blocks, one
  8-byte line per thread: the largest cluster (1, 2, 4 or 8) that divides the
  row's lines, needs no more of them than the one-shot's 64 lines per block
  ask for, and keeps lines per block <= 512 and blocks <= 64.

  Returns:
    (blocks, cluster_blocks, lines_per_block, threads), or None.
  """
  if rows < 1 or d < 1 or itemsize not in (2, 4):
    return None
  row_bytes = d * itemsize
  if row_bytes % 8 or rows * row_bytes > FUSED_MAX_BYTES:
    return None
  row_lines = row_bytes // 8
  wanted = -(-row_lines // FUSED_BLOCK_LINES)
  cb = FUSED_MAX_CLUSTER_BLOCKS
  while cb >= 1:
    if cb == 1 or (cb <= wanted and row_lines % cb == 0):
      per_block = row_lines // cb
      if per_block <= 512 and rows * cb <= 64:
        return rows * cb, cb, per_block, -(-per_block // 32) * 32
    cb //= 2
  return None


def add_rms_norm_refusal(shape, dtype, weight_dtype) -> str | None:
  """Why the fused kernel does not serve x of `shape` and `dtype` with a
  weight of `weight_dtype`, or None when it does."""
  dtype, weight_dtype = np.dtype(dtype), np.dtype(weight_dtype)
  if dtype not in FUSED_DTYPES:
    return f"the fused kernel takes float32, bfloat16 or float16, not {dtype}"
  if weight_dtype not in (dtype, np.dtype(np.float32)):
    return f"the fused kernel takes a weight of {dtype} or float32, not {weight_dtype}"
  if len(shape) < 1:
    return "the fused kernel needs at least one dimension"
  rows = int(np.prod(shape[:-1], dtype=np.int64))
  if add_rms_norm_grid(rows, int(shape[-1]), dtype.itemsize) is None:
    return (f"no grid of the fused kernel for {rows} rows of {shape[-1]} "
            f"{dtype} elements (rows of a multiple of 8 bytes, at most "
            f"{FUSED_MAX_BYTES} bytes in all)")
  return None
