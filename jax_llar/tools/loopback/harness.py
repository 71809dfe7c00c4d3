"""The loopback harness's logic: cases, inputs, checks and the fault verdict.

W ranks of one group are simulated on ONE GPU by the native harness
(``jax_llar.tools._llar_tools.loopback``; ``ffi/tools/loopback.h`` in the
repository): W scratch regions, W sets of epoch counters, error records and
peer tables (each table pointing at all W scratch regions on the same
device) and W launches of the production launcher per call, each rank on a
stream of its own so that the ranks' kernels run at once. This module makes
the inputs, runs the cases and checks every kept output of every rank
bitwise against the fast path's promise, a float64 sum in rank order rounded
once (`jax_llar.testing.rank_order_sum`; NaNs by position, as
`jax_llar.testing.bitwise_equal`); every rank's epoch counters must also
have advanced once per call. An algorithm of
``jax_llar.algorithms.NON_DETERMINISTIC`` (floating-point atomics: its float
sums depend on the order of arrival) is checked by its own rule instead
(`check_mode`): every rank's output bitwise the same, int32 bitwise the
reference, and every float element within
`jax_llar.testing.atomic_sum_violations`'s bound of the exact sum. The
command line is `jax_llar.tools.loopback`, which says what the harness does
and does not test.

Special inputs (`special_columns`): one input set of every case carries
signed zeros, subnormals, inf, inf - inf, NaN payloads and signalling NaNs,
overflow, cancellation that only a float64 sum resolves and rounding ties
(int32: sums that wrap). With ``nan_patterns`` another set carries NaN bit
patterns (`nan_pattern_lines`): every NaN of float16 and bfloat16 and a
sample of float32 NaNs, in every position of a 16-byte line, and 8-byte
words of all ones (the sentinel of one_shot_sentinel) beside their
neighbours. With ``bitwise_against`` every case also runs a second
algorithm on the same inputs and the two outputs must be equal byte for
byte (`bitwise_difference`; with ``bitwise_nan="position"`` the bits of
elements that are NaN in both are only counted), and with ``canonical_nan``
every NaN output must be the canonical NaN (`non_canonical_nans`).

Fault mode (`run_fault_case`): rank R's kernel is never launched on one
call; the others must end in the bounded wait's error, with the report that
`fault_problems` expects. It runs in a child process
(`jax_llar.tools.programs.loopback_fault`), because the timed-out kernel
traps and the CUDA context of its process is lost.

Call signatures (ffi/include/llar/ll.cuh, ``jax_llar.signature``): every
call carries one (`call_signature`, a different one per call, as a
program's call sites do), so every run also shows that correctly paired
calls never meet a foreign line. Two signature faults pair a call with a
call of another signature (`other_signature`), as two programs interleaved
differently per GPU or a rank-dependent extra call would: rank R runs one
extra call before call C ("extra_call"), or R's call C carries the other
signature ("swap_signature"). Each must end in the foreign-signature report
(code 2) before the timeout, never in a wrong sum (`signature_fault_problems`),
in a child process too.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import json
import os
import subprocess
import sys
import time
from typing import Any, Callable, Iterable, Sequence

import ml_dtypes
import numpy as np

from jax_llar import algorithms, testing
from jax_llar.tools import _native, report
from jax_llar.tools.progress import Progress

# Element types: flag spelling -> numpy dtype; the native module's
# DTYPE_CODES are keyed by str(dtype).
DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16),
          "float16": np.dtype(np.float16), "int32": np.dtype(np.int32)}
DTYPES.update({"f32": DTYPES["float32"], "bf16": DTYPES["bfloat16"],
               "f16": DTYPES["float16"], "i32": DTYPES["int32"]})
MAX_RANKS = algorithms.MAX_RANKS
MAX_BYTES = algorithms.MAX_BYTES[algorithms.Algorithm.ONE_SHOT_LL]  # per rank
IMPL = "loopback.one_shot_ll"
# The algorithms the harness cannot simulate, with the reason (the native
# harness refuses them too: kernels.h, AlgorithmEntry::lla2a_slots).
NOT_SIMULATED = {
    algorithms.Algorithm.NCCL_LLA2A_ONE_SHOT.short_name: (
        "it runs on NCCL's LL all-to-all session, which needs a device communicator "
        "over distinct GPUs, and the harness makes no NCCL call; run it on two GPUs "
        "(tests/gpu/test_lla2a.py, the kernel level)"),
}
# The algorithms the harness runs (kAlgorithms through the production launcher).
ALGORITHMS = tuple(a.short_name for a in algorithms.Algorithm
                   if a.short_name not in NOT_SIMULATED)
# The algorithms whose launchers take the generic and block_lines options.
ONE_SHOT_OPTIONS = ("one_shot_ll", "one_shot_sentinel")
# How run_case checks outputs: "bitwise" (the rank-order reference) or
# "atomic_sum" (jax_llar.testing.atomic_sum_violations, ranks identical).
BITWISE, ATOMIC_SUM = "bitwise", "atomic_sum"
# The two-shots: a timed-out wait may name a chunk owner that itself waits
# for the skipped rank (fault_problems).
TWO_SHOTS = ("two_shot_ll", "two_shot_ll128", "two_shot_ll128_atomic")


def check_mode(algorithm: str) -> str:
  """ATOMIC_SUM for an algorithm of algorithms.NON_DETERMINISTIC (a short
  name), else BITWISE."""
  a = algorithms.Algorithm.from_short_name(algorithm)
  return ATOMIC_SUM if a in algorithms.NON_DETERMINISTIC else BITWISE


def max_bytes(algorithm: str) -> int:
  """Largest payload per rank of `algorithm` (a short name)."""
  return algorithms.MAX_BYTES[algorithms.Algorithm.from_short_name(algorithm)]


def impl(s: Settings) -> str:
  """The rows' impl label: loopback.<algorithm>."""
  return f"loopback.{s.algorithm}"
NOTE = ("loopback harness: all ranks simulated on one GPU; tests the protocol "
        "logic and the reduction, not NVLink (every store is local), and measures "
        "no speed")
# Hardware queues asked of CUDA (read when the context is created), so that
# every rank's stream has its own.
MAX_CONNECTIONS = "32"
# one_shot_sentinel's error report: the fold of an armed word (sentinel.cuh).
SENTINEL_FOLD = 0xFFFFFFFF
# Seconds a fault may take beyond the kernel timeout until the host sees the error.
FAULT_SLACK_S = 8.0
# Seconds a fault child may take beyond twice its kernel timeout: starting
# JAX and CUDA, building the inputs.
CHILD_START_S = 180
CHILD = "jax_llar.tools.programs.loopback_fault"

DEFAULT_WORLDS = (2, 3, 4, 5, 8, 16)
DEFAULT_SIZES = (4, 100, 1024, 4096, 65536, 262144)


@dataclasses.dataclass(frozen=True)
class Settings:
  """What one run of the harness covers.

  Attributes:
    worlds: simulated world sizes, 2..16.
    dtypes: element types (keys of DTYPES).
    sizes: payload bytes per rank, 1..the algorithm's MAX_BYTES (a size that
      is not a whole number of elements of a dtype is skipped for it).
    calls: consecutive all-reduce calls per case.
    sets: input sets; call c uses set c % sets.
    specials: whether one input set carries special values.
    generic: the run-time world-size kernel for every world size.
    sync: synchronise all ranks between calls (else each rank's calls are
      ordered only by its own stream).
    block_lines: the grid rule's lines per block (0: production).
    timeout_ms: the kernels' bound on every wait.
    start_epochs: values every epoch counter starts from; each case runs
      once per value.
    misalign: bytes added to the input and output addresses (0..7).
    keep: calls whose outputs are checked, the last ones (0: all), capped
      by max_output_bytes.
    max_output_bytes: bound on the outputs held per case (device and host);
      `run_cases` holds up to 2 x CHECK_THREADS + 1 cases' inputs and outputs
      on the host while their checks wait, together at most MAX_WAITING_BYTES
      when a case starts (`run_cases`' max_waiting_bytes).
    seed: seed of the random inputs.
    device: CUDA ordinal to run on.
    algorithm: the algorithm under test, a short name (ALGORITHMS); generic
      and block_lines apply to ONE_SHOT_OPTIONS only.
    nan_patterns: input set 2 carries `nan_pattern_lines` (float dtypes; needs
      sets >= 3).
    bitwise_against: None, or the short name of a second algorithm that runs
      every case on the same inputs; both outputs must be equal byte for
      byte (cases outside its limits or dtypes are skipped).
    bitwise_nan: with bitwise_against, "exact" (NaN bits compared too) or
      "position" (where both are NaN the bits are not compared, only
      counted: nan_payload_differences).
    canonical_nan: every NaN output must be the canonical NaN (CANONICAL_NAN;
      reduce.cuh's rule for every algorithm).
    signatures: every call carries the signature `call_signature`
      (signature_seed, call), a different one per call as a program's call
      sites have (the algorithms of ``algorithms.SIGNED`` put it in their
      flags; the others ignore it); False: every call carries 0.
    signature_seed: 0-65535, the first call's signature minus one.
  """
  worlds: tuple[int, ...] = DEFAULT_WORLDS
  dtypes: tuple[str, ...] = ("float32", "bfloat16", "float16", "int32")
  sizes: tuple[int, ...] = DEFAULT_SIZES
  calls: int = 50
  sets: int = 4
  specials: bool = True
  generic: bool = False
  sync: bool = True
  block_lines: int = 0
  timeout_ms: int = 2000
  start_epochs: tuple[int, ...] = (0,)
  misalign: int = 0
  keep: int = 0
  max_output_bytes: int = 256 << 20
  seed: int = 0
  device: int = 0
  algorithm: str = "one_shot_ll"
  nan_patterns: bool = False
  bitwise_against: str | None = None
  bitwise_nan: str = "exact"
  canonical_nan: bool = True
  signatures: bool = True
  signature_seed: int = 0


@dataclasses.dataclass(frozen=True)
class Case:
  """One cell of the matrix."""
  world: int
  dtype: str
  n_bytes: int
  start_epoch: int = 0

  @property
  def np_dtype(self) -> np.dtype:
    return DTYPES[self.dtype]

  @property
  def n_elems(self) -> int:
    return self.n_bytes // self.np_dtype.itemsize


def validate(s: Settings) -> list[str]:
  """What is wrong with `s`, one sentence each (empty when nothing is)."""
  errors = []
  if not s.worlds or any(not 2 <= w <= MAX_RANKS for w in s.worlds):
    errors.append(f"world sizes must be 2-{MAX_RANKS}: {list(s.worlds)}")
  if not s.dtypes or any(d not in DTYPES for d in s.dtypes):
    errors.append(f"dtypes must be among {', '.join(sorted(DTYPES))}: {list(s.dtypes)}")
  if s.algorithm in NOT_SIMULATED:
    errors.append(f"the loopback harness cannot run {s.algorithm}: "
                  f"{NOT_SIMULATED[s.algorithm]}")
    limit = max_bytes(s.algorithm)
  elif s.algorithm not in ALGORITHMS:
    errors.append(f"algorithm must be one of {', '.join(ALGORITHMS)}: {s.algorithm!r}")
    limit = MAX_BYTES
  else:
    limit = max_bytes(s.algorithm)
    if s.algorithm not in ONE_SHOT_OPTIONS and (s.generic or s.block_lines):
      errors.append(f"generic and block_lines apply to {' and '.join(ONE_SHOT_OPTIONS)} only")
  if s.bitwise_against is not None and (s.bitwise_against not in ALGORITHMS
                                        or s.bitwise_against == s.algorithm):
    errors.append(f"bitwise_against must be another of {', '.join(ALGORITHMS)}: "
                  f"{s.bitwise_against!r}")
  if s.bitwise_against is not None and s.algorithm in ALGORITHMS and ATOMIC_SUM in (
      check_mode(s.algorithm), check_mode(s.bitwise_against)
      if s.bitwise_against in ALGORITHMS else BITWISE):
    errors.append("bitwise_against compares two algorithms byte for byte, which a "
                  "non-deterministic one (floating-point atomics) does not promise")
  if s.bitwise_nan not in ("exact", "position"):
    errors.append(f"bitwise_nan must be exact or position: {s.bitwise_nan!r}")
  if s.nan_patterns and s.sets < 3:
    errors.append("nan_patterns needs at least 3 input sets (set 2 carries them)")
  if not s.sizes or any(not 1 <= n <= limit for n in s.sizes):
    errors.append(f"sizes must be 1-{limit} bytes per rank: {list(s.sizes)}")
  if s.calls < 1:
    errors.append("calls must be positive")
  if not 1 <= s.sets <= 1024:
    errors.append("sets must be 1-1024")
  if not 0 <= s.block_lines <= 512:
    errors.append("block_lines must be 0 (production) or 1-512")
  if not 1 <= s.timeout_ms <= 600_000:
    errors.append("timeout_ms must be 1-600000")
  if not s.start_epochs or any(not 0 <= e < 2**64 - 2**32 for e in s.start_epochs):
    errors.append("start epochs must be non-negative and leave room for the calls")
  if not 0 <= s.misalign <= 15:
    errors.append("misalign must be 0-15 bytes")
  if not 0 <= s.keep <= s.calls:
    errors.append("keep must be 0 (all calls) or 1-calls")
  if s.max_output_bytes < 1:
    errors.append("max_output_bytes must be positive")
  if not 0 <= s.signature_seed <= 65535:
    errors.append("signature_seed must be 0-65535")
  return errors


# --- call signatures (ffi/tools/loopback.h, ffi/include/llar/ll.cuh) ------------

# The fault modes that pair a call with one of another signature; each must
# end in the foreign-signature report (code 2), never in a wrong sum.
SIGNATURE_FAULTS = ("extra_call", "swap_signature")
FOREIGN_SIGNATURE = 2  # ErrorRecord code (wait.cuh: kErrorForeignSignature)
LL128_ALGORITHMS = ("one_shot_ll128", "two_shot_ll128", "two_shot_ll128_atomic")


def call_signature(seed: int, call: int) -> int:
  """The signature the native harness gives call `call` (loopback.h:
  LoopbackSignature): 1 + (seed + call) mod 65535, never 0, and different
  for consecutive calls."""
  return 1 + (seed + call) % 65535


def other_signature(sig: int) -> int:
  """The signature of the fault modes' other call (loopback.h:
  OtherSignature): nonzero and not `sig` (nonzero)."""
  return 1 + (sig - 1 + 32768) % 65535


def ll_flag(epoch: int, sig: int) -> int:
  """The LL line's flag word of epoch `epoch` and signature `sig` (ll.cuh:
  FlagOf): sig << 16 | low16(epoch) | 1."""
  return (sig << 16) | (epoch & 0xFFFF) | 1


def expected_flags(algorithm: str, epoch: int, sig: int) -> tuple[int, int]:
  """(flag_expected, signature_expected) of a report by `algorithm`'s wait at
  `epoch` in a call of signature `sig` (0 for an unsigned algorithm): the LL
  flag, or the LL128 flag word's low half with the signature beside it."""
  if algorithm not in _SIGNED_NAMES:
    sig = 0
  if algorithm in LL128_ALGORITHMS:
    return (epoch & 0xFFFFFFFF) | 1, sig
  return ll_flag(epoch, sig), sig


_SIGNED_NAMES = frozenset(a.short_name for a in algorithms.SIGNED)


def cases(s: Settings) -> list[tuple[Case, str | None]]:
  """Every case of `s` in run order (world, dtype, size, start epoch), with
  the reason it is skipped before any device is asked, or None."""
  out = []
  for world in s.worlds:
    for dtype in s.dtypes:
      for n in s.sizes:
        for e in s.start_epochs:
          c = Case(world, dtype, n, e)
          reason = None
          if n % c.np_dtype.itemsize:
            reason = f"{n} bytes is not a whole number of {dtype} elements"
          elif (refusal := _dtype_refusal(s.algorithm, c.np_dtype)) is not None:
            reason = refusal
          elif s.bitwise_against is not None:
            if (refusal := _dtype_refusal(s.bitwise_against, c.np_dtype)) is not None:
              reason = f"bitwise_against: {refusal}"
            elif n > max_bytes(s.bitwise_against):
              reason = (f"bitwise_against: {n} bytes exceeds {s.bitwise_against}'s "
                        f"{max_bytes(s.bitwise_against)}")
          out.append((c, reason))
  return out


def _dtype_refusal(algorithm: str, dtype) -> str | None:
  if algorithm not in ALGORITHMS:
    return None  # validate() says so
  return algorithms.dtype_refusal(algorithms.Algorithm.from_short_name(algorithm), dtype)


def kept_calls(s: Settings, case: Case) -> int:
  """How many calls' outputs (the last ones) are kept and checked."""
  keep = s.keep or s.calls
  cap = max(1, s.max_output_bytes // (case.world * case.n_bytes))
  return max(1, min(keep, cap))


# --- inputs --------------------------------------------------------------------------


def special_columns(world: int, dtype) -> np.ndarray:
  """Special inputs, shape (k, world): column j of an input set holds row
  j % k across the ranks. For floats: signed zeros, subnormals and their sum
  into the normal range, inf, inf - inf, NaN at several ranks (a quiet NaN
  with a payload, a negative one, a signalling one), overflow of the sum,
  cancellation that only a float64 sum resolves, and a rounding tie. For
  int32: sums that wrap."""
  dtype = np.dtype(dtype)
  w = world
  if dtype == np.dtype(np.int32):
    i = np.iinfo(np.int32)
    rows = [[i.max] * w, [i.min] * w, [-1] * w, [i.max] + [1] * (w - 1),
            [i.min] + [-1] * (w - 1), [i.min, i.max] * (w // 2) + [0] * (w % 2)]
    return np.array(rows, np.int64).astype(np.int32)
  f = ml_dtypes.finfo(dtype)
  tiny = float(f.smallest_subnormal)
  top_sub = float(f.smallest_normal) - tiny  # largest subnormal
  big = 2.0 ** (f.nmant + 2)  # big + 1 rounds back to big in the dtype's precision
  half_ulp = 2.0 ** -(f.nmant + 1)  # 1 + half_ulp is a tie
  inf, nan = float("inf"), float("nan")

  def row(first, rest, last=None):
    r = [first] + [rest] * (w - 1)
    if last is not None:
      r[-1] = last
    return r

  rows = [
      [-0.0] * w,                                    # -0.0
      row(-0.0, 0.0),                                # +0.0
      row(0.0, 0.0, -0.0),                           # +0.0
      [tiny] * w,                                    # w subnormal steps
      [tiny if k % 2 == 0 else -tiny for k in range(w)],
      [top_sub] * w,                                 # into the normal range
      row(inf, 1.0),                                 # inf
      row(inf, 0.0, -inf),                           # NaN
      row(1.0, nan if w > 1 else 0.0),               # NaN at rank 1
      [float(f.max)] * w,                            # overflows to inf
      [float(f.max) if k % 2 == 0 else -float(f.max) for k in range(w)],
      (row(big, 1.0, -big) if w > 2 else [big, -big]),  # 1 only in float64 (w > 2)
      row(1.0, 0.0, half_ulp) if w > 2 else [1.0, half_ulp],  # a tie: to even
      row(1.0, half_ulp / 4, half_ulp) if w > 2 else [1.0, -half_ulp / 2],
  ]
  with np.errstate(over="ignore", invalid="ignore"):
    out = np.array(rows, np.float64).astype(dtype)
  # NaN bit patterns: a payload at the last rank, a negative NaN at rank 0,
  # a signalling NaN at rank 0 (its quiet bit clear).
  quiet, sign = (0x7FC00001, 0x80000000) if dtype.itemsize == 4 else (
      (0x7FC1, 0x8000) if dtype == np.dtype(ml_dtypes.bfloat16) else (0x7E01, 0x8000))
  signalling = {4: 0x7F800001}.get(dtype.itemsize) or (
      0x7F81 if dtype == np.dtype(ml_dtypes.bfloat16) else 0x7C01)
  extra = np.ones((3, w), np.float64).astype(dtype)
  bits = extra.view({2: np.uint16, 4: np.uint32}[dtype.itemsize])
  bits[0, -1] = quiet
  bits[1, 0] = quiet | sign
  bits[2, 0] = signalling
  return np.concatenate([out, extra])


def special_set(rng: np.random.Generator, base: np.ndarray) -> np.ndarray:
  """`base` (world, n) with the special columns at its first positions and
  again at random positions after them."""
  x = base.copy()
  world, n = x.shape
  cols = special_columns(world, x.dtype)
  k = len(cols)
  first = np.arange(min(n, k))
  more = k + rng.choice(max(0, n - k), size=min(max(0, n - k), 4 * k), replace=False)
  for i, p in enumerate(np.concatenate([first, more])):
    x[:, p] = cols[i % k]
  return x


# Bits of the 16-byte line and its two 8-byte words (one_shot_sentinel's
# unit of store and of poll, ffi/include/llar/sentinel.cuh).
LINE_BYTES = 16
_UINT = {2: np.uint16, 4: np.uint32}
# The quiet bit (top mantissa bit) of each float dtype's bit pattern.
QUIET_BIT = {np.dtype(np.float32): 1 << 22, np.dtype(ml_dtypes.bfloat16): 1 << 6,
             np.dtype(np.float16): 1 << 9}
# Exponent fields: all ones in a NaN or inf.
_EXPONENT = {np.dtype(np.float32): 0x7F800000, np.dtype(ml_dtypes.bfloat16): 0x7F80,
             np.dtype(np.float16): 0x7C00}
# The canonical NaN of each float dtype (ffi/include/llar/reduce.cuh:
# kCanonicalNaN32, kCanonicalNaN16): every NaN an all-reduce outputs, as bits.
CANONICAL_NAN = {np.dtype(np.float32): 0x7FFFFFFF, np.dtype(ml_dtypes.bfloat16): 0x7FFF,
                 np.dtype(np.float16): 0x7FFF}
# float32 NaNs always in the sample: all ones (the sentinel's half), the
# canonical ones, signalling ones, the sentinel's replacement (quiet bit of
# all ones cleared) and neighbours of each.
F32_NANS = (0xFFFFFFFF, 0x7FFFFFFF, 0xFFFFFFFE, 0x7FFFFFFE, 0x7FC00000, 0xFFC00000,
            0x7FC00001, 0x7F800001, 0xFF800001, 0x7FBFFFFF, 0xFFBFFFFF, 0xFFBFFFFE)


def nan_bit_patterns(dtype, rng: np.random.Generator, f32_sample: int = 2000) -> np.ndarray:
  """NaN bit patterns of a float dtype, as unsigned integers of its width:
  every one of float16 and bfloat16 (both signs, every non-zero mantissa,
  quiet and signalling), and for float32 F32_NANS plus `f32_sample` random
  ones (random sign and mantissa)."""
  dtype = np.dtype(dtype)
  exp = _EXPONENT[dtype]
  if dtype.itemsize == 2:
    b = np.arange(1 << 16, dtype=np.uint32)
    return b[((b & exp) == exp) & ((b & (0x7FFF ^ exp)) != 0)].astype(np.uint16)
  mant = rng.integers(1, 1 << 23, size=f32_sample, dtype=np.uint64)
  sign = rng.integers(0, 2, size=f32_sample, dtype=np.uint64) << 31
  sample = (exp | mant | sign).astype(np.uint32)
  return np.unique(np.concatenate([np.array(F32_NANS, np.uint32), sample]))


def nan_pattern_lines(rng: np.random.Generator, world: int, dtype) -> np.ndarray:
  """Input lines that put every NaN bit pattern (`nan_bit_patterns`) in
  every position of a 16-byte line, and 8-byte words of all ones beside their
  neighbours; shape (lines, world, 16 // itemsize), as unsigned integers.

  Blocks, in order:
    1. every pattern at every position at every rank at once (random order
       per rank and position: NaN + NaN of all kinds);
    2. every pattern at every position as the only NaN of its element
       (line j: rank j % world; the other ranks hold random finite values);
    3. for every rank r and word w of the line: w all ones at every rank; at
       r only; at r beside rank r+1's w equal to all ones with element 0's
       quiet bit cleared (the replacement one_shot_sentinel sends), and the
       reverse; at r beside a quiet NaN with a payload at r+1; and w all
       ones but one element (each position) another NaN at r.
  """
  dtype = np.dtype(dtype)
  u = _UINT[dtype.itemsize]
  per_line = LINE_BYTES // dtype.itemsize
  per_word = per_line // 2
  patterns = nan_bit_patterns(dtype, rng)
  k = len(patterns)

  def finite(lines):
    return np.ascontiguousarray(
        testing.random_array(rng, (lines, world, per_line), dtype)).view(u)

  every = np.empty((k, world, per_line), u)
  for r in range(world):
    for q in range(per_line):
      every[:, r, q] = rng.permutation(patterns)
  alone = finite(k)
  for q in range(per_line):
    alone[np.arange(k), np.arange(k) % world, q] = rng.permutation(patterns)

  ones = u(np.iinfo(u).max)
  replacement = u(int(ones) ^ QUIET_BIT[dtype])
  quiet_payload = u(_EXPONENT[dtype] | QUIET_BIT[dtype] | 1)
  other_nans = patterns[rng.integers(0, k, size=per_word)]
  words = []
  for r in range(world):
    nxt = (r + 1) % world
    for w in range(2):
      cols = slice(w * per_word, (w + 1) * per_word)
      block = finite(5 + per_word)
      block[0, :, cols] = ones                       # every rank
      block[1, r, cols] = ones                       # rank r only
      block[2, r, cols] = ones                       # beside the replacement
      block[2, nxt, cols] = ones
      block[2, nxt, w * per_word] = replacement
      block[3, r, cols] = ones                       # the reverse
      block[3, r, w * per_word] = replacement
      block[3, nxt, cols] = ones
      block[4, r, cols] = ones                       # beside a payload NaN
      block[4, nxt, w * per_word] = quiet_payload
      for e in range(per_word):                      # near the sentinel
        block[5 + e, r, cols] = ones
        block[5 + e, r, w * per_word + e] = other_nans[e]
      words.append(block)
  return np.concatenate([every, alone] + words)


def nan_pattern_set(rng: np.random.Generator, base: np.ndarray) -> np.ndarray:
  """`base` (world, n) with `nan_pattern_lines` over its first lines, as many
  as fit (all of them from about 64 KiB per rank for float16 and float32)."""
  x = base.copy()
  world, n = x.shape
  u = _UINT[x.dtype.itemsize]
  lines = nan_pattern_lines(rng, world, x.dtype)
  per_line = lines.shape[2]
  fit = min(len(lines), n // per_line)
  bits = x.view(u)
  bits[:, :fit * per_line] = lines[:fit].transpose(1, 0, 2).reshape(world, fit * per_line)
  return x


def make_inputs(rng: np.random.Generator, case: Case, sets: int,
                specials: bool, nan_patterns: bool = False) -> np.ndarray:
  """Input sets of `case`, shape (sets, world, n_elems): random data, with
  `specials` the special columns in set 1 (set 0 when there is one), and
  with `nan_patterns` (float dtypes, sets >= 3) `nan_pattern_set` in set 2."""
  # One draw: in set, then rank order (testing.random_array).
  x = testing.random_array(rng, (sets, case.world, case.n_elems), case.np_dtype)
  if specials:
    k = 1 if sets > 1 else 0
    x[k] = special_set(rng, x[k])
  if nan_patterns and sets >= 3 and case.np_dtype in QUIET_BIT:
    x[2] = nan_pattern_set(rng, x[2])
  return x


def references(inputs: np.ndarray) -> np.ndarray:
  """The promised output of each input set, shape (sets, n_elems)."""
  return np.stack([testing.rank_order_sum(list(x), x.dtype) for x in inputs])


# --- checking ------------------------------------------------------------------------


def mismatch_mask(got: np.ndarray, want: np.ndarray) -> np.ndarray:
  """Elementwise: True where `got` differs from `want` as
  `testing.bitwise_equal` counts it (same bits; any NaN equals any NaN).
  Shapes broadcast; dtypes must match."""
  got, want = np.asarray(got), np.asarray(want)
  if got.dtype != want.dtype:
    raise ValueError(f"dtypes differ: {got.dtype} and {want.dtype}")
  if got.dtype.kind != "f" and got.dtype != np.dtype(ml_dtypes.bfloat16):
    return np.asarray(got != want)
  view = {2: np.uint16, 4: np.uint32, 8: np.uint64}[got.dtype.itemsize]
  got, want = np.broadcast_arrays(got, want)
  differ = np.asarray(got.view(view) != want.view(view)).copy()
  if differ.any():  # only there can two NaNs differ in bits and still agree
    with np.errstate(invalid="ignore"):
      both_nan = (np.isnan(got[differ].astype(np.float64)) &
                  np.isnan(want[differ].astype(np.float64)))
    differ[differ] = ~both_nan
  return differ


def _describe(x, dtype: np.dtype) -> dict:
  view = {2: np.uint16, 4: np.uint32}[dtype.itemsize]
  bits = int(np.array([x], dtype).view(view)[0])
  with np.errstate(invalid="ignore"):
    value = (repr(float(np.array([x], dtype).astype(np.float64)[0]))
             if dtype.kind == "f" or dtype == np.dtype(ml_dtypes.bfloat16) else int(x))
  return {"bits": f"0x{bits:0{2 * dtype.itemsize}x}", "value": value}


def first_mismatch(outputs: np.ndarray, refs: np.ndarray, first_call: int,
                   inputs: np.ndarray | None = None) -> dict | None:
  """The first wrong element of the outputs, or None when all are right.

  Args:
    outputs: (kept, world, n) kept outputs; outputs[k] is call first_call + k.
    refs: (sets, n) the promised output of each input set; call c used set
      c % sets.
    first_call: the call of outputs[0].
    inputs: (sets, world, n), to quote the inputs of the wrong element.

  Returns:
    None, or ``{"call", "rank", "index", "got", "want" (each {"bits",
    "value"}), "inputs" (the ranks' inputs there, values), "wrong_elements"
    (over all calls and ranks), "wrong_calls" (how many calls had one)}``.
  """
  sets = refs.shape[0]
  found, wrong, wrong_calls = None, 0, 0
  for k in range(outputs.shape[0]):
    call = first_call + k
    bad = mismatch_mask(outputs[k], refs[call % sets][None, :])
    count = int(bad.sum())
    if not count:
      continue
    wrong += count
    wrong_calls += 1
    if found is None:
      rank, index = (int(v) for v in np.argwhere(bad)[0])
      dtype = outputs.dtype
      found = {"call": call, "rank": rank, "index": index,
               "got": _describe(outputs[k, rank, index], dtype),
               "want": _describe(refs[call % sets, index], dtype)}
      if inputs is not None:
        found["inputs"] = [_describe(v, dtype)["value"]
                           for v in inputs[call % sets, :, index]]
  if found is not None:
    found["wrong_elements"] = wrong
    found["wrong_calls"] = wrong_calls
  return found


def first_violation(outputs: np.ndarray, inputs: np.ndarray, first_call: int) -> dict | None:
  """The first element of the outputs that breaks the atomic-sum rule
  (`jax_llar.testing.atomic_sum_violations`), or None when none does.

  Args:
    outputs: (kept, world, n) kept outputs; outputs[k] is call first_call + k.
    inputs: (sets, world, n); call c used set c % sets.
    first_call: the call of outputs[0].

  Returns:
    None, or ``{"call", "rank", "index", "got", "want" (the float64
    rank-order reference rounded once, each {"bits", "value"}), "exact" (the
    exact sum, float64), "bound", "inputs", "wrong_elements", "wrong_calls"}``.
  """
  sets = inputs.shape[0]
  dtype = outputs.dtype
  found, wrong, wrong_calls = None, 0, 0
  for k in range(outputs.shape[0]):
    call = first_call + k
    x = inputs[call % sets]
    bad = testing.atomic_sum_violations(outputs[k], list(x), dtype)
    count = int(bad.sum())
    if not count:
      continue
    wrong += count
    wrong_calls += 1
    if found is None:
      rank, index = (int(v) for v in np.argwhere(bad)[0])
      found = {"call": call, "rank": rank, "index": index,
               "got": _describe(outputs[k, rank, index], dtype),
               "want": _describe(testing.rank_order_sum(list(x[:, index:index + 1]),
                                                        dtype)[0], dtype),
               "inputs": [_describe(v, dtype)["value"] for v in x[:, index]]}
      if dtype != np.dtype(np.int32):
        e, bound, _ = testing.atomic_sum_bound(list(x[:, index:index + 1]), dtype)
        found["exact"], found["bound"] = float(e[0]), float(bound[0])
  if found is not None:
    found["wrong_elements"] = wrong
    found["wrong_calls"] = wrong_calls
  return found


def ranks_agree(outputs: np.ndarray) -> bool:
  """Whether every rank's output of every kept call has rank 0's bits
  (outputs: (kept, world, n))."""
  u = _UINT[outputs.dtype.itemsize]
  return bool((outputs.view(u) == outputs.view(u)[:, :1]).all())


def differing_from_reference(outputs: np.ndarray, inputs: np.ndarray, first_call: int) -> int:
  """Elements of the kept outputs that are not bitwise the rank-order
  reference (NaNs by position): how far an atomic sum strayed from it."""
  sets = inputs.shape[0]
  refs = references(inputs)
  return sum(int(mismatch_mask(outputs[k], refs[(first_call + k) % sets][None, :]).sum())
             for k in range(outputs.shape[0]))


def _nan(x: np.ndarray) -> np.ndarray:
  """Elementwise: True where `x` (a float dtype) is a NaN. float32 through
  numpy's isnan; the 16-bit floats from their bits (the exponent all ones
  and a mantissa not zero), several times faster than isnan on them and
  without a copy in another dtype."""
  if x.dtype not in QUIET_BIT:
    return np.zeros(x.shape, bool)
  if x.dtype == np.dtype(np.float32):
    return np.isnan(x)
  return (np.ascontiguousarray(x).view(np.uint16) & np.uint16(0x7FFF)) > np.uint16(
      _EXPONENT[x.dtype])


def bitwise_difference(outputs: np.ndarray, other: np.ndarray, first_call: int,
                       inputs: np.ndarray | None = None, nan: str = "exact") -> dict | None:
  """Where two algorithms' outputs of the same calls differ in any bit, or
  None when they are equal byte for byte (nan="exact"), or equal except for
  the bits of elements that are NaN in both (nan="position").

  Args:
    outputs, other: (kept, world, n) outputs of the same calls, same dtype.
    first_call: the call of outputs[0].
    inputs: (sets, world, n), to quote the inputs of the first difference.
    nan: "exact" or "position".

  Returns:
    None, or ``{"call", "rank", "index", "got", "other" (each {"bits",
    "value"}), "inputs" (bits, per rank), "elements" (how many differ)}``.
  """
  u = _UINT[outputs.dtype.itemsize]
  a, b = outputs.view(u), other.view(u)
  if a.shape != b.shape:
    return {"shape": [list(a.shape), list(b.shape)]}
  differ = a != b
  if nan == "position":
    differ &= ~(_nan(outputs) & _nan(other))
  if not differ.any():
    return None
  k, rank, index = (int(v) for v in np.argwhere(differ)[0])
  dtype = outputs.dtype
  out = {"call": first_call + k, "rank": rank, "index": index,
         "got": _describe(outputs[k, rank, index], dtype),
         "other": _describe(other[k, rank, index], dtype),
         "elements": int(differ.sum())}
  if inputs is not None:
    sets = inputs.shape[0]
    out["inputs"] = [_describe(v, dtype)["bits"]
                     for v in inputs[(first_call + k) % sets, :, index]]
  return out


def nan_payload_differences(outputs: np.ndarray, other: np.ndarray) -> int:
  """Elements that are NaN in both `outputs` and `other` with other bits."""
  u = _UINT[outputs.dtype.itemsize]
  return int(((outputs.view(u) != other.view(u)) & _nan(outputs) & _nan(other)).sum())


def non_canonical_nans(outputs: np.ndarray) -> int:
  """NaN elements of `outputs` whose bits are not CANONICAL_NAN's."""
  if outputs.dtype not in CANONICAL_NAN:
    return 0
  u = _UINT[outputs.dtype.itemsize]
  return int((_nan(outputs) & (outputs.view(u) != CANONICAL_NAN[outputs.dtype])).sum())


def nan_bits(outputs: np.ndarray, limit: int = 16) -> list[str]:
  """The distinct bit patterns of the NaNs among `outputs` (a float dtype),
  as hex strings, at most `limit` of them."""
  dtype = outputs.dtype
  if dtype not in QUIET_BIT:
    return []
  u = _UINT[dtype.itemsize]
  found = np.unique(np.ascontiguousarray(outputs).view(u)[_nan(outputs)])
  return [f"0x{int(v):0{2 * dtype.itemsize}x}" for v in found[:limit]]


# --- one case ------------------------------------------------------------------------


def _reported(records: Sequence[dict]) -> list[dict]:
  return [dict(r) for r in records if r.get("code")]


@dataclasses.dataclass
class Ran:
  """A case that ran on the device and whose outputs are still to be
  checked: `finish()` checks them (host work only: numpy over the inputs and
  outputs the case holds; it touches neither the device nor the random
  generator) and returns the case's row. `nbytes`: the host bytes it holds
  until then (its inputs and the runs' outputs), which `run_cases` bounds."""
  row: dict
  finish: Callable[[], dict]
  nbytes: int = 0


def run_case(mod: Any, s: Settings, case: Case, rng: np.random.Generator, *,
             defer: bool = False) -> dict | Ran:
  """Runs one case on the native harness and checks it.

  Args:
    mod: the native tools module (or a stand-in with its two functions).
    s, case: what to run.
    rng: the inputs' random generator (drawn here, in the caller's thread).
    defer: return the check undone, as a `Ran`, for a case that ran to its
      end on the device (`run_cases` checks it in a worker thread while the
      next case runs); a case that did not run (skipped, a CUDA error) is
      returned as its row either way.

  Returns:
    The case's row (or, with `defer`, a `Ran` whose finish() returns it):
    impl, world_size, dtype, bytes_per_rank, start_epoch, calls,
    calls_checked, kernel, sync, status ("pass", "fail", "skipped" or
    "error"), correct, plan, and as they apply first_mismatch, reason,
    cuda_error (this algorithm's run, or the bitwise_against run's, named
    so, with bitwise_error and that run's records as bitwise_records: either
    loses the context), records (the ranks' non-empty error records),
    epoch_mismatch, seconds (the harness's wall time, not a speed).
  """
  keep = kept_calls(s, case)
  row = {"impl": impl(s), "world_size": case.world, "dtype": case.dtype,
         "bytes_per_rank": case.n_bytes, "start_epoch": case.start_epoch,
         "calls": s.calls, "calls_checked": keep, "sync": s.sync,
         "generic": s.generic, "block_lines": s.block_lines, "misalign": s.misalign,
         "status": "error", "correct": False}
  code = mod.DTYPE_CODES[str(case.np_dtype)]
  algorithm = int(algorithms.Algorithm.from_short_name(s.algorithm))
  plan = dict(mod.loopback_plan(case.world, case.n_bytes, code, calls=s.calls, keep=keep,
                                n_sets=s.sets, algorithm=algorithm, generic=s.generic,
                                block_lines=s.block_lines, ordinal=s.device))
  row["plan"] = plan
  row["kernel"] = "generic" if plan["generic_kernel"] else f"world {case.world}"
  if not plan["co_resident"]:
    row["status"] = "skipped"
    row["reason"] = (f"not co-resident: {case.world} x {plan['blocks']} blocks of "
                     f"{plan['threads']} threads > {plan['sms']} SMs x "
                     f"{plan['blocks_per_sm']} blocks")
    return row
  if s.bitwise_against is not None:
    other = dict(mod.loopback_plan(
        case.world, case.n_bytes, code, calls=s.calls, keep=keep, n_sets=s.sets,
        algorithm=int(algorithms.Algorithm.from_short_name(s.bitwise_against)),
        ordinal=s.device))
    if not other["co_resident"]:
      row["status"] = "skipped"
      row["reason"] = (f"bitwise_against {s.bitwise_against}: not co-resident: "
                       f"{case.world} x {other['blocks']} blocks of {other['threads']} "
                       f"threads > {other['sms']} SMs x {other['blocks_per_sm']} blocks")
      return row
  inputs = make_inputs(rng, case, s.sets, s.specials, s.nan_patterns)
  raw = np.ascontiguousarray(inputs).view(np.uint8)
  sig_kw = signature_kwargs({"signatures": s.signatures,
                             "signature_seed": s.signature_seed})
  r = mod.loopback(raw, code, s.calls, sync=s.sync, keep=keep, algorithm=algorithm,
                   generic=s.generic,
                   block_lines=s.block_lines, timeout_ms=float(s.timeout_ms),
                   start_epoch=case.start_epoch, misalign=s.misalign, ordinal=s.device,
                   **sig_kw)
  row["seconds"] = r["seconds"]
  row["signatures"] = s.signatures
  want_sigs = [call_signature(s.signature_seed, c) if s.signatures else 0
               for c in range(s.calls)]
  if r.get("signatures") is not None and list(r["signatures"]) != want_sigs:
    row["signature_mismatch"] = (f"the native harness gave the calls signatures "
                                 f"{list(r['signatures'])[:4]}..., not {want_sigs[:4]}...")
  row["max_connections"] = r["max_connections"]
  records = _reported(r["records"])
  if records:
    row["records"] = records
  if r["cuda_error"] is not None:
    row["cuda_error"] = r["cuda_error"]
    row["failed_call"] = r["failed_call"]
    row["deadline_exceeded"] = r["deadline_exceeded"]
    return row
  # The second algorithm runs here too: every device run of a case ends
  # before run_case returns (a deferred check runs beside the next case).
  other = None if s.bitwise_against is None else _run_other(mod, s, case, raw, code, keep)
  if other is not None and other["cuda_error"] is not None:
    # The second run lost the process's CUDA context: the case is a CUDA
    # error (so that run_cases runs nothing more on the dead context), not a
    # difference between the two algorithms.
    row["bitwise_against"] = s.bitwise_against
    row["bitwise_error"] = other["cuda_error"]
    row["cuda_error"] = f"{s.bitwise_against} (bitwise_against): {other['cuda_error']}"
    row["failed_call"] = other.get("failed_call")
    row["deadline_exceeded"] = other.get("deadline_exceeded")
    if other_records := _reported(other["records"]):
      row["bitwise_records"] = other_records
    return row
  check = functools.partial(_check_case, s, case, keep, inputs, r, other, records, row)
  held = inputs.nbytes + np.asarray(r["outputs"]).nbytes + (
      0 if other is None else np.asarray(other["outputs"]).nbytes)
  return Ran(row, check, held) if defer else check()


def _check_case(s: Settings, case: Case, keep: int, inputs: np.ndarray, r: dict,
                other: dict | None, records: list[dict], row: dict) -> dict:
  """The checks of a case that ran (`run_case`; `other`: the bitwise_against
  algorithm's run): fills and returns its row."""
  outputs = np.asarray(r["outputs"]).view(case.np_dtype)
  row["check"] = check_mode(s.algorithm)
  if row["check"] == ATOMIC_SUM:
    mismatch = first_violation(outputs, inputs, r["first_kept_call"])
    row["ranks_bitwise_equal"] = ranks_agree(outputs)
    row["differing_from_reference"] = differing_from_reference(
        outputs, inputs, r["first_kept_call"])
  else:
    mismatch = first_mismatch(outputs, references(inputs), r["first_kept_call"], inputs)
  row["epoch_mismatch"] = r["epoch_mismatch"]
  ok = (mismatch is None and r["epochs_checked"] and r["epoch_mismatch"] is None
        and not records and outputs.shape[0] == keep
        and row.get("ranks_bitwise_equal", True) and "signature_mismatch" not in row)
  if mismatch is not None:
    row["first_mismatch"] = mismatch
  row["nan_bits"] = nan_bits(outputs)
  if s.canonical_nan:
    row["non_canonical_nans"] = non_canonical_nans(outputs)
    ok = ok and row["non_canonical_nans"] == 0
  if other is not None:
    ok = _check_bitwise(s, case, inputs, outputs, r, other, row) and ok
  row["status"] = "pass" if ok else "fail"
  row["correct"] = ok
  return row


def _run_other(mod: Any, s: Settings, case: Case, raw: np.ndarray, code: int,
               keep: int) -> dict:
  """Runs s.bitwise_against on the same inputs and calls (its production
  launcher, synchronised as `s` says); returns the native harness's result."""
  other_id = int(algorithms.Algorithm.from_short_name(s.bitwise_against))
  return mod.loopback(raw, code, s.calls, sync=s.sync, keep=keep, algorithm=other_id,
                      timeout_ms=float(s.timeout_ms), start_epoch=case.start_epoch,
                      misalign=s.misalign, ordinal=s.device,
                      **signature_kwargs({"signatures": s.signatures,
                                          "signature_seed": s.signature_seed}))


def _check_bitwise(s: Settings, case: Case, inputs: np.ndarray, outputs: np.ndarray, r: dict,
                   o: dict, row: dict) -> bool:
  """Compares the outputs with s.bitwise_against's run `o` (`_run_other`;
  one that lost the context never gets here, `run_case` ends the case) byte
  for byte; fills the row's bitwise_* fields. True when they are equal."""
  row["bitwise_against"] = s.bitwise_against
  other = np.asarray(o["outputs"]).view(case.np_dtype)
  difference = bitwise_difference(outputs, other, r["first_kept_call"], inputs,
                                  nan=s.bitwise_nan)
  row["bitwise_nan"] = s.bitwise_nan
  row["bitwise_equal"] = difference is None
  row["bitwise_nan_bits"] = nan_bits(other)
  row["nan_payload_differences"] = nan_payload_differences(outputs, other)
  if difference is not None:
    row["bitwise_difference"] = difference
  u = _UINT[case.np_dtype.itemsize]
  ranks_agree = bool((outputs.view(u) == outputs.view(u)[:, :1]).all())
  row["ranks_bitwise_equal"] = ranks_agree
  return difference is None and ranks_agree


# --- fault mode ----------------------------------------------------------------------


def fault_spec(s: Settings, case: Case, skip_rank: int, skip_call: int, *,
               fault: str = "skip", fault_rank: int = -1, fault_call: int = 0) -> dict:
  """What a fault child runs (its one command-line argument, as JSON).

  `fault` "skip" (skip_rank's kernel left out of call skip_call), or one of
  SIGNATURE_FAULTS on call `fault_call` of rank `fault_rank`: "extra_call"
  (the rank first runs one extra call of another signature) or
  "swap_signature" (the rank's call carries another signature)."""
  return {"world": case.world, "dtype": case.dtype, "n_bytes": case.n_bytes,
          "start_epoch": case.start_epoch, "calls": s.calls, "sync": s.sync,
          "generic": s.generic, "block_lines": s.block_lines,
          "timeout_ms": s.timeout_ms, "misalign": s.misalign, "sets": s.sets,
          "seed": s.seed, "device": s.device, "skip_rank": skip_rank,
          "skip_call": skip_call, "algorithm": s.algorithm,
          "signatures": s.signatures, "signature_seed": s.signature_seed,
          "fault": fault, "fault_rank": fault_rank, "fault_call": fault_call}


def fault_errors(s: Settings, skip_rank: int = -1, extra_call_rank: int = -1,
                 swap_signature_rank: int = -1, fault_call: int = 0) -> list[str]:
  """What is wrong with a fault request for `s`, one sentence each."""
  errors = []
  if sum(r >= 0 for r in (skip_rank, extra_call_rank, swap_signature_rank)) > 1:
    errors.append("one fault at a time: skip_rank, extra_call_rank or swap_signature_rank")
  if max(extra_call_rank, swap_signature_rank) >= 0:
    if s.algorithm not in _SIGNED_NAMES:
      errors.append(f"{s.algorithm} carries no call signature (algorithms.SIGNED: "
                    f"{', '.join(sorted(_SIGNED_NAMES))}), so a signature fault cannot "
                    "be detected")
    if not s.signatures:
      errors.append("a signature fault needs signed calls (signatures on)")
    if not 0 <= fault_call < s.calls:
      errors.append("fault_call must be one of the calls (below calls)")
  return errors


def signature_kwargs(spec: dict) -> dict:
  """The native loopback's keyword arguments for `spec`'s signatures and
  signature fault (none at their defaults: signed calls from seed 0, no
  signature fault)."""
  kw = {}
  if not spec.get("signatures", True) or spec.get("signature_seed", 0):
    kw.update(signatures=bool(spec.get("signatures", True)),
              signature_seed=int(spec.get("signature_seed", 0)))
  fault = spec.get("fault", "skip")
  if fault in SIGNATURE_FAULTS:
    kw[f"{fault}_rank"] = spec["fault_rank"]
    kw["fault_call"] = spec["fault_call"]
  return kw


def _call_signature_of(spec: dict, call: int) -> int:
  return call_signature(spec.get("signature_seed", 0), call) if spec.get("signatures", True) else 0


def fault_problems(spec: dict, data: dict | None) -> list[str]:
  """Why a fault child's report is not the bounded-wait error expected of
  `spec`, one sentence each; empty when it is.

  Expected: the run stopped with a CUDA error (the trap) at call skip_call,
  before the host deadline; at least one rank reported; every report is
  from a rank other than skip_rank about itself (``rank`` = its index),
  names skip_rank as the peer (the two-shots: skip_rank, or a chunk owner
  whose reduction waits for skip_rank), carries the epoch of call skip_call and its
  flag (one_shot_sentinel: the sentinel's fold 0xffffffff as expected and as
  both words seen, sentinel.cuh: neither word arrived; two_shot_ll128_atomic's
  wait for an arrival mask: the mask expected, one without skip_rank's bit
  seen, and skip_rank as the peer), and waited at least
  the timeout; the error came within the timeout
  and the trap's wait for the report (wait.cuh) of the last launch; and
  skip_rank reported nothing. The flag expected is that of call skip_call's
  signature (`expected_flags`).

  A signature fault (``spec["fault"]`` in SIGNATURE_FAULTS) is checked by
  `signature_fault_problems` instead.
  """
  if data is None:
    return ["the child printed no result"]
  if data.get("unavailable"):
    return [f"the child cannot run the harness: {data['unavailable']}"]
  if data.get("skipped"):
    return []
  if spec.get("fault", "skip") in SIGNATURE_FAULTS:
    return signature_fault_problems(spec, data)
  problems = []
  rank_r, call = spec["skip_rank"], spec["skip_call"]
  timeout_s = spec["timeout_ms"] / 1e3
  epoch = spec["start_epoch"] + call
  if data.get("deadline_exceeded"):
    problems.append("the kernels still ran at the host deadline (a hang)")
  if not data.get("cuda_error"):
    problems.append("no CUDA error: the waits did not fail")
  if data.get("failed_call") != call:
    problems.append(f"the error came at call {data.get('failed_call')}, not {call}")
  records = data.get("records") or []
  reported = [(i, r) for i, r in enumerate(records) if r.get("code")]
  if not reported:
    problems.append("no rank reported a timed-out wait")
  for i, r in reported:
    where = f"rank {i}'s report"
    if r.get("code") != 1:
      problems.append(f"{where}: code {r.get('code')}, not 1 (timeout)")
    if i == rank_r:
      problems.append(f"{where}: the skipped rank reported")
    if r.get("rank") != i:
      problems.append(f"{where}: names rank {r.get('rank')} as the one that waited")
    two_shot = spec.get("algorithm", "one_shot_ll") in TWO_SHOTS
    if r.get("peer") != rank_r and not (two_shot and r.get("peer") not in (i, None)):
      problems.append(f"{where}: names peer {r.get('peer')}, not {rank_r}")
    if r.get("epoch") != epoch:
      problems.append(f"{where}: epoch {r.get('epoch')}, not {epoch}")
    if spec.get("algorithm") == "one_shot_sentinel":
      seen = (r.get("flag_expected"), r.get("flag_seen"), r.get("flag_seen2"))
      if seen != (SENTINEL_FOLD,) * 3:
        problems.append(f"{where}: flag fields {seen}, not the sentinel's fold "
                        f"{SENTINEL_FOLD} three times (nothing arrived)")
    elif (spec.get("algorithm") == "two_shot_ll128_atomic"
          and r.get("flag_expected") == arrival_mask(spec["world"], i)):
      # The wait for the owner's arrival mask (two_shot_ll128_atomic.cuh):
      # the expected mask, the mask last seen without the skipped rank's
      # bit, and that rank named as the peer.
      if r.get("flag_seen", 0) & (1 << rank_r) or r.get("peer") != rank_r:
        problems.append(f"{where}: arrival mask {r.get('flag_seen')} of "
                        f"{r.get('flag_expected')} with peer {r.get('peer')}, not "
                        f"rank {rank_r}'s bit missing")
    else:
      want_flag, want_sig = expected_flags(spec.get("algorithm", "one_shot_ll"), epoch,
                                           _call_signature_of(spec, call))
      if r.get("flag_expected") != want_flag:
        problems.append(f"{where}: expected flag {r.get('flag_expected')}, not {want_flag}")
      if r.get("signature_expected", 0) != want_sig:
        problems.append(f"{where}: expected signature {r.get('signature_expected')}, not "
                        f"{want_sig}")
    if r.get("waited_ns", 0) < spec["timeout_ms"] * 1e6:
      problems.append(f"{where}: waited {r.get('waited_ns')} ns, less than the timeout")
  took = data.get("seconds_to_error")
  # The bound: the kernel timeout, the trap's wait for the published report
  # (at most one second, wait.cuh), the driver's handling of the trap until
  # the host sees the error, and slack.
  if took is not None and data.get("cuda_error") and took > timeout_s + FAULT_SLACK_S:
    problems.append(f"the error came {took:.2f} s after the last launch, more than "
                    f"the timeout + {FAULT_SLACK_S:g} s")
  return problems


def signature_fault_problems(spec: dict, data: dict) -> list[str]:
  """Why a signature fault child's report is not the foreign-signature error
  expected of `spec`, one sentence each; empty when it is.

  Expected: the run stopped with a CUDA error (the trap) at call
  fault_call, before the host deadline; the native harness used the
  signatures `call_signature` and `other_signature` give; at least one rank
  reported; every report has code 2 (a foreign signature, never a timeout:
  the other call's line is there to see), is about the rank that wrote it,
  at call fault_call's epoch, and was written before the timeout ran out.
  The fault rank's report (its call carries the other signature, S') names
  another rank as the peer, S' as expected and the call's signature S as
  seen; every other rank's names the fault rank, S expected and S' seen. The
  flags are the two calls' flags of that epoch (`expected_flags`; an LL line
  seen with both flag words equal). Not every rank need report: the first
  trap ends every simulated rank's kernel (one CUDA context).
  """
  problems = []
  rank_r, call = spec["fault_rank"], spec["fault_call"]
  algorithm = spec.get("algorithm", "one_shot_ll")
  epoch = spec["start_epoch"] + call
  sig = _call_signature_of(spec, call)
  other = other_signature(sig)
  if data.get("deadline_exceeded"):
    problems.append("the kernels still ran at the host deadline (a hang)")
  if not data.get("cuda_error"):
    problems.append("no CUDA error: the mispaired call was not stopped")
  if data.get("failed_call") != call:
    problems.append(f"the error came at call {data.get('failed_call')}, not {call}")
  native = data.get("signatures")
  if native is not None and (len(native) <= call or native[call] != sig
                             or data.get("fault_signature") != other):
    problems.append(f"the native harness used signatures {native} and "
                    f"{data.get('fault_signature')}, not {sig} and {other} at call {call}")
  records = data.get("records") or []
  reported = [(i, r) for i, r in enumerate(records) if r.get("code")]
  if not reported:
    problems.append("no rank reported")
  ll128 = algorithm in LL128_ALGORITHMS
  for i, r in reported:
    where = f"rank {i}'s report"
    if r.get("code") != FOREIGN_SIGNATURE:
      problems.append(f"{where}: code {r.get('code')}, not {FOREIGN_SIGNATURE} "
                      "(foreign signature)")
    if r.get("rank") != i:
      problems.append(f"{where}: names rank {r.get('rank')} as the one that waited")
    if r.get("epoch") != epoch:
      problems.append(f"{where}: epoch {r.get('epoch')}, not {epoch}")
    mine, theirs = (other, sig) if i == rank_r else (sig, other)
    if i == rank_r and r.get("peer") in (rank_r, None):
      problems.append(f"{where}: names peer {r.get('peer')}, itself")
    if i != rank_r and r.get("peer") != rank_r:
      problems.append(f"{where}: names peer {r.get('peer')}, not {rank_r}")
    if (r.get("signature_expected"), r.get("signature_seen")) != (mine, theirs):
      problems.append(f"{where}: signatures {r.get('signature_expected')} expected and "
                      f"{r.get('signature_seen')} seen, not {mine} and {theirs}")
    want_flag, _ = expected_flags(algorithm, epoch, mine)
    seen_flag, _ = expected_flags(algorithm, epoch, theirs)
    seen = (r.get("flag_seen"), r.get("flag_seen2"))
    want_seen = (seen_flag, theirs) if ll128 else (seen_flag, seen_flag)
    if r.get("flag_expected") != want_flag or seen != want_seen:
      problems.append(f"{where}: flags {r.get('flag_expected')} expected and {seen} seen, "
                      f"not {want_flag} and {want_seen}")
    if r.get("flag_epoch_bits") != (32 if ll128 else 16):
      problems.append(f"{where}: flag_epoch_bits {r.get('flag_epoch_bits')}")
    if r.get("waited_ns", 0) >= spec["timeout_ms"] * 1e6:
      problems.append(f"{where}: waited {r.get('waited_ns')} ns, the whole timeout "
                      "(the foreign line was not seen at once)")
  took = data.get("seconds_to_error")
  if took is not None and data.get("cuda_error") and (
      took > spec["timeout_ms"] / 1e3 + FAULT_SLACK_S):
    problems.append(f"the error came {took:.2f} s after the last launch, more than "
                    f"the timeout + {FAULT_SLACK_S:g} s")
  return problems


def arrival_mask(world: int, rank: int) -> int:
  """The arrival mask rank `rank`'s wait expects in two_shot_ll128_atomic:
  every rank's bit but its own."""
  return ((1 << world) - 1) & ~(1 << rank)


def run_fault_child(spec: dict, env: dict[str, str] | None = None) -> dict:
  """Runs one fault case in a child process, bounded.

  Returns:
    ``{"data": the child's JSON line or None, "rc", "hung" (the child was
    killed at its deadline), "tail" (the last lines of its output)}``.
  """
  timeout = CHILD_START_S + 2 * spec["timeout_ms"] / 1e3
  cmd = [sys.executable, "-m", CHILD, json.dumps(spec)]
  child_env = dict(os.environ if env is None else env)
  child_env.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", MAX_CONNECTIONS)
  child_env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  try:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=child_env)
  except subprocess.TimeoutExpired as e:
    out = (e.stdout or b"")
    out = out.decode(errors="replace") if isinstance(out, bytes) else out
    return {"data": None, "rc": None, "hung": True, "tail": out[-2000:]}
  data = None
  for line in reversed(p.stdout.splitlines()):
    if line.startswith("{"):
      try:
        data = json.loads(line)
      except json.JSONDecodeError:
        continue
      break
  return {"data": data, "rc": p.returncode, "hung": False,
          "tail": (p.stdout + p.stderr)[-2000:]}


def run_fault_case(s: Settings, case: Case, skip_rank: int, skip_call: int, *,
                   fault: str = "skip", fault_rank: int = -1, fault_call: int = 0) -> dict:
  """One fault case in a child process (`fault_spec`'s fault); its row
  (status "pass" when the report is what `fault_problems` expects)."""
  spec = fault_spec(s, case, skip_rank, skip_call, fault=fault, fault_rank=fault_rank,
                    fault_call=fault_call)
  row = {"impl": impl(s) + ".fault", "world_size": case.world, "dtype": case.dtype,
         "bytes_per_rank": case.n_bytes, "start_epoch": case.start_epoch,
         "calls": s.calls, "sync": s.sync, "generic": s.generic,
         "skip_rank": skip_rank, "skip_call": skip_call, "timeout_ms": s.timeout_ms,
         "status": "fail", "correct": False}
  if fault in SIGNATURE_FAULTS:
    row.update(fault=fault, fault_rank=fault_rank, fault_call=fault_call)
  t0 = time.monotonic()
  child = run_fault_child(spec)
  row["child_seconds"] = round(time.monotonic() - t0, 3)
  data = child["data"]
  if child["hung"]:
    row["problems"] = ["the child process did not end by its deadline (a hang)"]
    row["tail"] = child["tail"]
    return row
  if data is not None and data.get("skipped"):
    row["status"] = "skipped"
    row["reason"] = data["skipped"]
    return row
  problems = fault_problems(spec, data)
  if data is not None:
    row.update({k: data.get(k) for k in ("cuda_error", "failed_call", "seconds_to_error",
                                         "deadline_exceeded", "plan")})
    if fault in SIGNATURE_FAULTS:
      row["fault_signature"] = data.get("fault_signature")
    row["records"] = _reported(data.get("records") or [])
  if problems:
    row["problems"] = problems
    row["tail"] = child["tail"]
  else:
    row["status"] = "pass"
    row["correct"] = True
  return row


# --- the run -------------------------------------------------------------------------


def _line(row: dict) -> str:
  kernel = row.get("kernel", "")
  head = (f"W={row['world_size']:<2d} {row['dtype']:9s} {row['bytes_per_rank']:7d} B "
          f"e0={row['start_epoch']:<10d} {kernel:9s} ")
  status = row["status"].upper()
  if row.get("fault") in SIGNATURE_FAULTS:
    head += f"{row['fault']} rank {row['fault_rank']} at call {row['fault_call']}: "
  elif "skip_rank" in row:
    head += f"skip rank {row['skip_rank']} at call {row['skip_call']}: "
  elif row["status"] in ("pass", "fail"):
    head += f"{row['calls_checked']:3d}/{row['calls']} calls checked: "
  detail = ""
  if row.get("bitwise_difference"):
    d = row["bitwise_difference"]
    detail = (f" differs from {row['bitwise_against']} at call {d.get('call')} rank "
              f"{d.get('rank')} [{d.get('index')}]: {d.get('got')} vs {d.get('other')}, "
              f"inputs {d.get('inputs')}; {d.get('elements')} elements")
  elif row.get("bitwise_error"):
    detail = f" {row['bitwise_against']}: {row['bitwise_error']}"
  elif row.get("first_mismatch"):
    m = row["first_mismatch"]
    detail = (f" call {m['call']} rank {m['rank']} [{m['index']}]: got "
              f"{m['got']['value']} ({m['got']['bits']}), want {m['want']['value']} "
              f"({m['want']['bits']}); {m['wrong_elements']} wrong elements")
  elif row.get("reason"):
    detail = f" {row['reason']}"
  elif row.get("problems"):
    detail = " " + "; ".join(row["problems"][:3])
  elif row.get("cuda_error"):
    detail = f" {row['cuda_error']}"
  elif row.get("epoch_mismatch"):
    detail = f" {row['epoch_mismatch']}"
  elif row.get("signature_mismatch"):
    detail = f" {row['signature_mismatch']}"
  if row.get("records") and row.get("fault") in SIGNATURE_FAULTS:
    r = row["records"][0]
    detail += (f" (rank {r['rank']}, signature {r.get('signature_expected')}, met rank "
               f"{r['peer']}'s line of signature {r.get('signature_seen')} at epoch "
               f"{r['epoch']}, code {r['code']}; {len(row['records'])} report(s))")
  elif row.get("records") and "skip_rank" in row:
    r = row["records"][0]
    detail += (f" (rank {r['rank']} waited for rank {r['peer']}, block {r['block']}, "
               f"line {r['line']}, epoch {r['epoch']}; {len(row['records'])} report(s))")
  return head + status + detail


# Threads that check in-process cases' outputs (`run_cases`) while the next
# case runs on the device.
CHECK_THREADS = max(1, min(8, os.cpu_count() or 1))
# Host bytes the cases waiting for their checks may hold together (run_cases).
MAX_WAITING_BYTES = 1 << 30


def run_cases(items: Iterable[tuple[dict, str | None, Callable[[], dict | Ran], str]],
              line: Callable[[dict], str], *, in_process: bool = True,
              total: int | None = None, jobs: int = 1,
              check_threads: int = CHECK_THREADS,
              max_waiting_bytes: int = MAX_WAITING_BYTES) -> list[dict]:
  """Runs loopback cases, printing `line(row)` for each in case order, and,
  with `total` (the number of cases), a progress line with the time left
  about every twentieth of them.

  Args:
    items: per case (base row, reason to skip it or None, a function that
      runs it and returns its row or a `Ran` (`run_case`'s defer), a label
      for messages). A run or a check that raises ValueError or RuntimeError
      gives an "error" row; in process, a RuntimeError of a run (a failed
      set-up) or a row with a ``cuda_error`` (a lost CUDA context) makes
      every later case a "not_run" row that says why.
    line: a row's line.
    in_process: the cases run in this process; False when each runs in a
      child (fault mode), whose lost context leaves this one intact.
    jobs: with `in_process` False, how many cases (children) run at once,
      each with a CUDA context of its own that the GPU time-slices. Keep it
      at 1 for cases that trap: on one H200, eight trapping children at once
      made each other's bounded waits end tens of seconds late or not by the
      host's deadline. In process the cases always run one at a time on the
      device.
    check_threads: in process, the threads that check `Ran` cases while
      the next cases run (at most twice as many cases wait for their check;
      the rows still come in case order).
    max_waiting_bytes: in process, the host bytes (`Ran.nbytes`: inputs
      and outputs) the cases waiting for their checks may hold together
      when the next case starts; past it, the oldest checks are waited for
      first (a case larger than the bound is checked before the next case
      runs). The running case and the checks' own temporaries come on top.

  Returns:
    The rows, one per case, in case order.
  """
  progress = Progress(total, "loopback") if total else None
  every = max(1, (total or 1) // 20)
  rows: list[dict] = []

  def ran(row: dict) -> None:
    rows.append(row)
    if row["status"] != "not_run":
      print(line(row), flush=True)
    if progress is not None and (len(rows) % every == 0 or len(rows) == total):
      progress.step(n=len(rows) - progress.done)

  def error_row(base: dict, e: Exception) -> dict:
    return base | {"status": "error", "reason": f"{type(e).__name__}: {e}"}

  def attempt(base: dict, go: Callable[[], dict | Ran]) -> tuple[dict | Ran, str | None]:
    """The case's row (or Ran), and why later in-process cases cannot run
    (or None)."""
    try:
      return go(), None
    except (ValueError, RuntimeError) as e:
      broken = f"an earlier case failed to set up ({e})" if isinstance(e, RuntimeError) else None
      return error_row(base, e), broken

  def finish(base: dict, case: Ran) -> dict:
    try:
      return case.finish()
    except (ValueError, RuntimeError) as e:
      return error_row(base, e)

  if not in_process and jobs > 1:
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
      pending = [(base, reason, None if reason is not None else pool.submit(attempt, base, go))
                 for base, reason, go, _ in items]
      for base, reason, future in pending:
        ran(base | {"status": "skipped", "reason": reason} if future is None
            else future.result()[0])
    return rows

  broken = None  # why the CUDA context can no longer be used (in process)
  # Rows and checks under way, in case order; a head that is done is printed.
  waiting: collections.deque = collections.deque()
  with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, check_threads)) as pool:

    held = {}  # a waiting check's future -> the bytes its case holds

    def flush(most: int) -> None:
      """Prints the rows at the head that are done, waiting for checks while
      more than `most` are under way or they hold more than
      max_waiting_bytes."""
      future = concurrent.futures.Future
      while waiting and (len(waiting) > most or sum(held.values()) > max_waiting_bytes
                         or not isinstance(waiting[0], future) or waiting[0].done()):
        head = waiting.popleft()
        if isinstance(head, future):
          held.pop(head, None)
        ran(head.result() if isinstance(head, future) else head)

    for base, reason, go, label in items:
      if reason is not None:
        row = base | {"status": "skipped", "reason": reason}
      elif broken is not None:
        row = base | {"status": "not_run", "reason": broken}
      else:
        row, failed = attempt(base, go)
        if isinstance(row, Ran):
          nbytes = row.nbytes
          row = pool.submit(finish, base, row)
          held[row] = nbytes
        elif in_process:
          broken = failed
          if row.get("cuda_error"):
            broken = (f"the CUDA context was lost in an earlier case ({label}: "
                      f"{row['cuda_error']})")
      waiting.append(row)
      flush(2 * max(1, check_threads))
    flush(0)
  if broken is not None:
    print(f"stopped: {broken}; {sum(r['status'] == 'not_run' for r in rows)} case(s) "
          "not run", flush=True)
  return rows


def run(s: Settings, skip_rank: int = -1, skip_call: int = 0, *,
        extra_call_rank: int = -1, swap_signature_rank: int = -1,
        fault_call: int = 0, jobs: int = 1) -> dict:
  """Runs every case of `s` (fault mode when skip_rank, extra_call_rank or
  swap_signature_rank is >= 0, at most one of them: `fault_spec`'s faults,
  the signature ones on call `fault_call`, with up to `jobs` child
  processes at once, `run_cases`); prints one line per case, in case order.

  Returns:
    ``{"env", "level": "loopback", "note", "settings", "rows"}``.

  In fault mode this process starts no CUDA context before its children
  have run (a GPU in an exclusive compute mode admits one process at a
  time); the environment block, read last, starts JAX's backends.

  Raises:
    RuntimeError: when the native tools module is unavailable (not in
      fault mode, where each child says so).
  """
  fault, fault_rank = "skip", skip_rank
  if extra_call_rank >= 0:
    fault, fault_rank = "extra_call", extra_call_rank
  elif swap_signature_rank >= 0:
    fault, fault_rank = "swap_signature", swap_signature_rank
  faulty = fault_rank >= 0
  mod = _native.require("python -m jax_llar.tools.loopback") if not faulty else None
  rng = np.random.default_rng(s.seed)

  def items():
    for case, reason in cases(s):
      if reason is None and fault_rank >= case.world:
        reason = f"no rank {fault_rank} in a group of {case.world}"
      base = {"impl": impl(s), "world_size": case.world, "dtype": case.dtype,
              "bytes_per_rank": case.n_bytes, "start_epoch": case.start_epoch,
              "status": "error", "correct": False}
      if fault in SIGNATURE_FAULTS:
        go = functools.partial(run_fault_case, s, case, -1, 0, fault=fault,
                               fault_rank=fault_rank, fault_call=fault_call)
      elif faulty:
        go = functools.partial(run_fault_case, s, case, skip_rank, skip_call)
      else:
        go = functools.partial(run_case, mod, s, case, rng, defer=True)
      yield base, reason, go, f"W={case.world} {case.dtype} {case.n_bytes} B"

  rows = run_cases(items(), _line, in_process=not faulty, total=sum(1 for _ in cases(s)),
                   jobs=jobs)
  return {"env": report.environment(), "level": "loopback", "note": NOTE,
          "settings": dataclasses.asdict(s) | {
              "skip_rank": skip_rank, "skip_call": skip_call,
              "extra_call_rank": extra_call_rank,
              "swap_signature_rank": swap_signature_rank, "fault_call": fault_call},
          "rows": rows}


def summary(rows: Sequence[dict]) -> dict[str, int]:
  """Rows per status."""
  out: dict[str, int] = {}
  for r in rows:
    out[r["status"]] = out.get(r["status"], 0) + 1
  return out
