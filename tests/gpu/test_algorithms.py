"""What every forced algorithm must do on real GPUs (over NVLink on the 2 x
H200 machine), one test per check, parametrised over the algorithms of
`ALGORITHMS`, the table that says for each: the rule its output is held to,
the dtypes it serves, the element counts its value test runs, and the data
of the checks that apply to it. Each test forces the algorithm with
settings.algorithm (as JAX_LLAR_ALGORITHM=<name> does) and raises max_bytes
to the cap (gpu_helpers.force), and asserts from the dispatch log that the
algorithm was taken.

The checks, where the table gives their data:
- test_random_values_all_sizes: every dtype it serves, element counts from
  one element to its limit (`element_counts`): odd tails, one element either
  side of multiples of its line, block and grid boundaries; for the
  two-shots, counts of fewer lines than ranks and chunk counts not divisible
  by the number of ranks, several steps per line slot.
- test_special_values (the two-shots): float32, 300,001 elements (1.2 MB:
  beyond the one-shot, several chunks, odd) with 0, -0, inf, NaN, subnormals
  and the largest values at random places.
- test_many_calls_in_one_program: 200 consecutive calls in one jit (the
  epoch parity, both halves, the two-shots' regions, the atomic's
  accumulator halves and the sentinel's re-arming reused without a barrier;
  the one-shot LL128 across more calls than one half of its scratch): every
  rank the same bits and, at a power-of-two world (1/world exact: every
  step exact on values that are multiples of 1/8), exactly the reference.
- test_equals_the_one_shot_ll_bit_for_bit (the sentinel and NCCL's LLA2A
  session): every NaN pattern of the 16-bit dtypes (a sample of float32's),
  the all-ones words the sentinel's sender replaces, -0.0, subnormals and
  inf (loopback_harness.nan_pattern_set, special_set): both bitwise the
  reference and the one-shot LL's output the same bits, NaN bits included,
  every NaN the canonical one (ffi/include/llar/sentinel.cuh and reduce.cuh,
  NaN results).
- test_region_is_reported: a communicator set holds the region of every
  algorithm a lowering picked, and status() reports exactly their sum (for
  NCCL's LLA2A session, NCCL's buffer).

The algorithms:
- two_shot_ll: the two-shot LL, up to 4 MiB, sizes below, at and beyond the
  one-shot limit. The tuning table does not dispatch to it yet (it waits for
  measurements on 2 GPUs).
- two_shot_ll128: the two-shot LL128, sizes around the 120-byte line, up to
  its 4 MiB limit. The tuning table does not dispatch to it (it waits for
  measurements on 2 GPUs and for the store-atomicity test over NVLink,
  python -m jax_llar.tools.store_atomicity --writer_device 0
  --reader_device 1).
- two_shot_ll128_atomic: held to its rule, not bitwise equality (it is not
  deterministic; ffi/src/kernels/two_shot_ll128_atomic.cuh): every rank gets
  the same bits, int32 is bitwise the reference, every float element is
  within jax_llar.testing.atomic_sum_violations's bound of the exact sum.
  Its all-gather rests on 128-byte stores arriving whole (the
  store-atomicity test across the GPUs comes first), its reduce-scatter on
  .sys-scope atomics and a release fence; no tuning table may choose it
  (test_two_shot_ll128_atomic.py).
- one_shot_ll128: the one-shot LL128, sizes around the 120-byte line (one
  line, a warp's 4, a block's 64, the grid's last) up to its limit; it waits
  for the same measurements and store-atomicity test as the two-shot LL128.
  Bitwise the one-shot LL's output at sizes both serve: test_ll128.py.
- one_shot_sentinel: up to its 512 KiB limit (the one-shot LL's limit
  included), the float dtypes only (int32 refused: test_sentinel.py). The
  tuning table does not dispatch to it yet.
- nccl_lla2a_one_shot: the one-shot all-reduce on NCCL's LL all-to-all
  session, from one element to its 256 KiB limit; its other tests (many
  calls of two sizes, the kernel bench, a peer that never calls):
  test_lla2a.py.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax
import numpy as np
import pytest

import jax_llar
from jax_llar import algorithms, testing
from jax_llar.algorithms import Algorithm

from gpu_helpers import (ALL_DTYPES, ATOMIC_SUM, BF16, BITWISE, DTYPES, F32, UINT,
                         allreduce_per_rank, check_rule, force, psum_op, same_bits, took)


@dataclasses.dataclass(frozen=True)
class ManyCalls:
  """test_many_calls_in_one_program's payload: elements, dtype, seed."""
  n: int
  dtype: np.dtype
  seed: int


@dataclasses.dataclass(frozen=True)
class Algo:
  """An algorithm's row of the table."""
  algorithm: Algorithm
  rule: str  # BITWISE or ATOMIC_SUM (gpu_helpers.check_rule)
  dtypes: tuple  # the dtypes it serves
  line_bytes: int  # the payload of one of its lines
  lines: Callable[[int], Sequence[int]]  # world -> the line counts of its value test
  random_seed: int
  region_seed: int
  special_values_seed: int | None = None  # test_special_values
  many_calls: ManyCalls | None = None  # test_many_calls_in_one_program
  nan_patterns_seed: int | None = None  # test_equals_the_one_shot_ll_bit_for_bit

  @property
  def name(self) -> str:
    return self.algorithm.short_name

  @property
  def limit(self) -> int:
    return algorithms.MAX_BYTES[self.algorithm]


ALGORITHMS = {a.name: a for a in [
    Algo(Algorithm.TWO_SHOT_LL, BITWISE, tuple(ALL_DTYPES), 8,
         # fewer lines than ranks, chunk counts not divisible by the world,
         # grid boundaries, beyond the one-shot limit, several steps
         lambda w: (1, 2, 3, w - 1, w + 1, 64 * w + 1, 4096 * w + 3, 64 * 64 * w,
                    32768 + 1, 65536 * w + 5, 131072 + 7),
         random_seed=11, region_seed=7, special_values_seed=12,
         many_calls=ManyCalls(1 << 18, F32, 13)),  # 1 MiB
    Algo(Algorithm.TWO_SHOT_LL128, BITWISE, tuple(ALL_DTYPES), 120,
         # several steps per line slot from 2 x 4096 lines a rank
         lambda w: (1, 2, 3, w - 1, w + 1, 8 * w + 1, 4096 * w + 3, 2 * 4096 * w + 5),
         random_seed=11, region_seed=7, special_values_seed=12,
         many_calls=ManyCalls(1 << 18, F32, 13)),
    Algo(Algorithm.TWO_SHOT_LL128_ATOMIC, ATOMIC_SUM, tuple(ALL_DTYPES), 120,
         lambda w: (1, 2, 3, w - 1, w + 1, 8 * w + 1, 4096 * w + 3, 2 * 4096 * w + 5),
         random_seed=21, region_seed=26, special_values_seed=22,
         many_calls=ManyCalls(1 << 18, F32, 23)),
    Algo(Algorithm.ONE_SHOT_LL128, BITWISE, tuple(ALL_DTYPES), 120,
         # one line, a warp's 4, a block's 64, the grid's last
         lambda w: (1, 4, 5, 64, 65, 513, 4095),
         random_seed=21, region_seed=27,
         many_calls=ManyCalls(120 * 64 * 10 // 4, F32, 23)),  # 640 lines
    Algo(Algorithm.ONE_SHOT_SENTINEL, BITWISE, tuple(DTYPES), 16,
         # a block's 64 lines, the last of 64 x 64 lines, the one-shot LL's limit
         lambda w: (1, 2, 63, 64, 65, 64 * 64, 64 * 64 + 1, 16384),
         random_seed=21, region_seed=25,
         many_calls=ManyCalls(1 << 17, BF16, 24), nan_patterns_seed=22),  # 256 KiB
    Algo(Algorithm.NCCL_LLA2A_ONE_SHOT, BITWISE, tuple(ALL_DTYPES), 8,
         # a block's 64 lines, the last block of 64 x 64 lines (then the
         # grid's 64 blocks grow)
         lambda w: (1, 2, 63, 64, 65, 64 * 64, 64 * 64 + 1, 16384),
         random_seed=41, region_seed=45, nan_patterns_seed=42),
]}


def element_counts(a: Algo, dtype, world: int) -> list[int]:
  """One element, odd counts (tails), one element either side of each line
  count of a.lines(world) and of the limit's lines, and the limit's
  elements."""
  per_line = a.line_bytes // dtype.itemsize
  counts = {1, 3, 7, 1023, 4097, a.limit // dtype.itemsize}
  for ln in (*a.lines(world), a.limit // a.line_bytes):
    for d in (-1, 0, 1):
      c = ln * per_line + d
      if 0 < c * dtype.itemsize <= a.limit:
        counts.add(c)
  return sorted(counts)


def _where(field):
  """The table's algorithms that have data for `field`."""
  return [pytest.param(a, id=a.name) for a in ALGORITHMS.values()
          if getattr(a, field) is not None]


@pytest.mark.parametrize("a,dtype", [pytest.param(a, d, id=f"{a.name}-{d}")
                                     for a in ALGORITHMS.values() for d in a.dtypes])
def test_random_values_all_sizes(mesh, a, dtype, monkeypatch):
  force(monkeypatch, a.algorithm)
  rng = np.random.default_rng(a.random_seed)
  op = psum_op()  # a program of its own (not the one-shot's cache)
  for n in element_counts(a, dtype, mesh.size):
    inputs = [testing.random_array(rng, (n,), dtype) for _ in range(mesh.size)]
    check_rule(mesh, inputs, dtype, a.rule, op)
    assert took(a.algorithm, n * dtype.itemsize), f"n={n}: {a.name} not taken"


@pytest.mark.parametrize("a", _where("special_values_seed"))
def test_special_values(mesh, a, monkeypatch):
  force(monkeypatch, a.algorithm)
  dtype = F32
  rng = np.random.default_rng(a.special_values_seed)
  n = 300_001  # 1.2 MB: beyond the one-shot, several chunks, odd
  specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 3.4e38],
                      dtype=dtype)
  inputs = []
  for _ in range(mesh.size):
    x = testing.random_array(rng, (n,), dtype)
    x[rng.integers(0, n, 64)] = rng.choice(specials, 64)
    inputs.append(x)
  out = check_rule(mesh, inputs, dtype, a.rule)  # NaNs canonical included
  assert np.isnan(out[0]).any()
  assert took(a.algorithm, n * 4)


@pytest.mark.parametrize("a", _where("many_calls"))
def test_many_calls_in_one_program(mesh, a, monkeypatch):
  force(monkeypatch, a.algorithm)
  spec = a.many_calls
  dtype = spec.dtype
  inv = np.float32(1.0 / mesh.size)

  def step(x):  # float32 arithmetic, the result in `dtype` (no-ops for float32)
    return (x.astype(np.float32) * inv).astype(dtype)

  def op(v):
    def body(_, acc):
      return step(jax_llar.psum(acc, "x"))
    return jax.lax.fori_loop(0, 200, body, v)

  rng = np.random.default_rng(spec.seed)
  inputs = [np.round(testing.random_array(rng, (spec.n,), dtype) * 8) / 8
            for _ in range(mesh.size)]
  out = allreduce_per_rank(mesh, inputs, op)
  for r in range(mesh.size):
    assert same_bits(out[r], out[0]), f"rank {r} differs from rank 0"
  if mesh.size & (mesh.size - 1) == 0:  # 1/world exact: every step exact
    x = step(testing.rank_order_sum(inputs, dtype))
    for _ in range(199):
      x = step(testing.rank_order_sum([x] * mesh.size, dtype))
    assert testing.bitwise_equal(out[0], x)
  assert took(a.algorithm, spec.n * dtype.itemsize)


@pytest.mark.parametrize("a,dtype", [pytest.param(a, d, id=f"{a.name}-{d}")
                                     for a in ALGORITHMS.values()
                                     if a.nan_patterns_seed is not None
                                     for d in DTYPES if d in a.dtypes])
def test_equals_the_one_shot_ll_bit_for_bit(mesh, a, dtype, monkeypatch):
  """Every NaN pattern of the 16-bit dtypes (a sample of float32's), the
  all-ones words the sentinel's sender replaces, -0.0, subnormals and inf:
  `a` and the one-shot LL are each bitwise the reference with every NaN
  canonical, and give the same bits, NaN bits included."""
  rng = np.random.default_rng(a.nan_patterns_seed)
  from jax_llar.tools.loopback import harness as lh  # pylint: disable=g-import-not-at-top
  per_line = 16 // dtype.itemsize  # nan_pattern_lines' 16-byte rows
  lines = lh.nan_pattern_lines(rng, mesh.size, dtype)
  n = min(lines.shape[0] * per_line + 5, a.limit // dtype.itemsize)  # and a tail
  base = np.stack([testing.random_array(rng, (n,), dtype) for _ in range(mesh.size)])
  inputs = list(lh.special_set(rng, lh.nan_pattern_set(rng, base)))
  outs = {}
  for algorithm in (Algorithm.ONE_SHOT_LL, a.algorithm):
    force(monkeypatch, algorithm)
    outs[algorithm] = check_rule(mesh, inputs, dtype)
    assert took(algorithm, n * dtype.itemsize), algorithm
  ll, got = outs[Algorithm.ONE_SHOT_LL], outs[a.algorithm]
  nan = lh._nan(got)  # pylint: disable=protected-access
  assert np.array_equal(nan, lh._nan(ll)) and nan.any()  # pylint: disable=protected-access
  assert lh.non_canonical_nans(got) == 0
  u = UINT[dtype.itemsize]
  assert np.array_equal(ll.view(u), got.view(u)), np.argwhere(ll.view(u) != got.view(u))[:5]


@pytest.mark.parametrize("a", _where("region_seed"))
def test_region_is_reported(mesh, a, monkeypatch):
  """A communicator set holds the region of every algorithm a lowering
  picked, and status() reports exactly their sum."""
  force(monkeypatch, a.algorithm)
  rng = np.random.default_rng(a.region_seed)
  check_rule(mesh, [testing.random_array(rng, (1024,), F32) for _ in range(mesh.size)],
             F32, a.rule)
  assert took(a.algorithm, 4096)
  held = [s for s in jax_llar.status()["comm_sets"] if a.name in s["regions"]]
  assert held, jax_llar.status()["comm_sets"]
  for s in held:
    expect = sum(algorithms.region_bytes(Algorithm.from_short_name(r), s["world_size"])
                 for r in s["regions"])
    assert s["scratch_bytes_per_device"] == expect, s
