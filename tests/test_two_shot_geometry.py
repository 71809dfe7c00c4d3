"""The two-shot's pure geometry: the chunking rule, the grid rule, the scratch
size and the slot layout (args.h, kernels.h; their Python mirrors in
jax_llar.algorithms), and that the mirrors' constants equal the C++ source."""

from __future__ import annotations

import itertools

import pytest

from jax_llar import algorithms
from jax_llar.algorithms import (Algorithm, region_bytes, two_shot_chunk, two_shot_grid,
                                 two_shot_max_steps)

from test_layout import _constexpr_expressions, _evaluate

TWO = Algorithm.TWO_SHOT_LL
LIMIT = algorithms.MAX_BYTES[TWO]
WORLDS = range(2, algorithms.MAX_RANKS + 1)
MiB = 1 << 20


def _offset(step, half, phase, world, src, block, t):
  """args.h: TwoShotOffset (from the base of the two-shot's region)."""
  return ((((((step * 2 + half) * 2 + phase) * world + src) * 64 + block) * 512 + t) * 16)


def test_constants_equal_the_cpp_source():
  exprs = _constexpr_expressions()
  assert _evaluate("kTwoShotMaxBytes", exprs) == LIMIT == 4 * MiB
  assert _evaluate("kTwoShotStepLines", exprs) == algorithms.TWO_SHOT_STEP_LINES
  assert _evaluate("kTwoShotBlockLines", exprs) == algorithms.TWO_SHOT_BLOCK_LINES
  assert _evaluate("kTwoShotPhases", exprs) == 2
  # The claim word, then one set of 64 x 16 counters per algorithm id 1..7.
  assert (_evaluate("kClaimWord", exprs), _evaluate("kMaxAlgorithms", exprs),
          _evaluate("kStateWords", exprs)) == (0, 8, 1 + 7 * 1024)


@pytest.mark.parametrize("world", WORLDS)
def test_chunks_partition_the_payload_as_equal_as_possible(world):
  for lines in itertools.chain(range(0, 3 * world + 2), (4097, 65537, LIMIT // 8,
                                                          LIMIT // 8 - 1, 131073)):
    chunks = [two_shot_chunk(lines, world, q) for q in range(world)]
    start = 0
    for s, n in chunks:
      assert s == start
      start += n
    assert start == lines
    sizes = [n for _, n in chunks]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)
    if lines:
      assert sizes[0] >= 1  # chunk 0 is never empty (two_shot_ll.cuh's reuse argument)


def test_chunks_of_counts_not_divisible_by_the_ranks():
  # 3 ranks, 10 lines: 4, 3, 3.
  assert [two_shot_chunk(10, 3, q) for q in range(3)] == [(0, 4), (4, 3), (7, 3)]
  # Fewer lines than ranks: the first `lines` ranks own one line each.
  assert [two_shot_chunk(2, 4, q) for q in range(4)] == [(0, 1), (1, 1), (2, 0), (2, 0)]


@pytest.mark.parametrize("world", WORLDS)
def test_grid_covers_the_largest_chunk_within_the_scratch(world):
  for n_bytes in (1, 4, 100, 4100, 65540, 262148, 1048580, LIMIT - 4, LIMIT):
    blocks, per_block, threads, steps = two_shot_grid(n_bytes, world)
    chunk = two_shot_chunk(-(-n_bytes // 8), world, 0)[1]
    assert 1 <= blocks <= 64 and blocks * per_block >= chunk
    assert threads % 32 == 0 and 32 <= threads <= 512
    assert steps * threads >= per_block and (steps - 1) * threads < per_block
    assert steps <= two_shot_max_steps(world)
    assert per_block < 1 << 16  # AllReduceArgs::lines_per_block is 16 bits
    # Every slot the call uses lies in the two-shot's region (RegionBytes).
    last = _offset(steps - 1, 1, 1, world, world - 1, blocks - 1, threads - 1)
    assert last + 16 <= region_bytes(TWO, world)


def test_grid_at_the_limit():
  assert two_shot_grid(LIMIT, 2) == (64, 4096, 512, 8)
  assert two_shot_grid(LIMIT, 16) == (64, 512, 512, 1)
  assert two_shot_grid(64 * 1024, 2) == (64, 64, 64, 1)
  assert two_shot_grid(4, 8) == (1, 1, 32, 1)


def test_region_bytes():
  for w in WORLDS:
    assert region_bytes(Algorithm.ONE_SHOT_LL, w) == MiB * w
    # The two-shot's region ends exactly at its last slot.
    assert region_bytes(TWO, w) == _offset(two_shot_max_steps(w), 0, 0, w, 0, 0, 0)
    assert region_bytes(TWO, w) < 1 << 31  # the 32-bit offsets
  assert [two_shot_max_steps(w) for w in (2, 3, 4, 5, 8, 15, 16)] == [8, 6, 4, 4, 2, 2, 1]
  assert {w: region_bytes(TWO, w) // MiB for w in (2, 3, 4, 8, 16)} == {
      2: 32, 3: 36, 4: 32, 8: 32, 16: 32}


def test_region_bytes_match_the_extension():
  import ctypes  # pylint: disable=g-import-not-at-top
  import importlib  # pylint: disable=g-import-not-at-top
  from jax_llar import _ext  # pylint: disable=g-import-not-at-top
  if not _ext.built():
    pytest.skip("the CUDA extension is not built here")
  path = _ext.nccl_library_path()
  if path is None:
    pytest.skip("no libnccl.so.2 to load the CUDA extension with (install the "
                "cuda13 extra)")
  ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
  ext = importlib.import_module("jax_llar._llar")
  for a in Algorithm:
    for w in WORLDS:
      assert ext.region_bytes(int(a), w) == region_bytes(a, w), (a, w)
  assert ext.region_bytes(0, 2) == 0 and ext.region_bytes(len(Algorithm) + 1, 2) == 0
