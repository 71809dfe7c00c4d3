"""The dispatch policy, pure: ``jax_llar.policy.choose`` and the tuning table.

No JAX devices, no fakes, no monkeypatching: the policy is a function of
(dtype, bytes per rank, number of ranks, max_bytes, table). Every threshold
of every table entry is checked one element below, at and one element above,
for every supported dtype; every reason, and the order in which the reasons
are checked.
"""

from __future__ import annotations

import ast
import pathlib

import ml_dtypes
import numpy as np
import pytest

from jax_llar import policy
from jax_llar.algorithms import (LARGEST_MAX_BYTES, MAX_BYTES, MAX_RANKS,
                                 SUPPORTED_DTYPES, Algorithm)
from jax_llar.policy import TUNING_TABLE, Choice, TuningEntry, choose

ONE_SHOT_LL = Algorithm.ONE_SHOT_LL
BF16 = np.dtype(ml_dtypes.bfloat16)
CAP = LARGEST_MAX_BYTES
DTYPE_IDS = [str(d) for d in SUPPORTED_DTYPES]


def _reason(dtype, nbytes, ranks, max_bytes=CAP, table=TUNING_TABLE):
  return choose(dtype, nbytes, ranks, max_bytes=max_bytes, table=table).reason


# --- the algorithms and the table ------------------------------------------------


def test_algorithm_names_and_ids():
  assert int(ONE_SHOT_LL) == 1
  assert (ONE_SHOT_LL.short_name, ONE_SHOT_LL.impl) == ("one_shot_ll",
                                                        "llar.one_shot_ll")
  assert Algorithm.from_short_name("one_shot_ll") is ONE_SHOT_LL
  with pytest.raises(ValueError, match="one_shot_ll"):
    Algorithm.from_short_name("two_shot")
  assert MAX_BYTES == {ONE_SHOT_LL: 262144, Algorithm.TWO_SHOT_LL: 4194304}
  assert LARGEST_MAX_BYTES == 4194304
  assert MAX_RANKS == 16
  assert SUPPORTED_DTYPES == (np.dtype(np.float32), BF16, np.dtype(np.float16),
                              np.dtype(np.int32))


def test_tuning_table_is_well_formed():
  """Entries within the kernels' limits, ranks 2..MAX_RANKS covered without
  overlap, and a source for each."""
  covered = []
  for e in TUNING_TABLE:
    assert isinstance(e.algorithm, Algorithm)
    assert 2 <= e.min_ranks <= e.max_ranks <= MAX_RANKS
    assert 0 < e.max_bytes <= MAX_BYTES[e.algorithm]
    assert len(e.source) > 20
    covered += range(e.min_ranks, e.max_ranks + 1)
  assert sorted(covered) == list(range(2, MAX_RANKS + 1))
  assert [(e.algorithm, e.min_ranks, e.max_ranks, e.max_bytes)
          for e in TUNING_TABLE] == [(ONE_SHOT_LL, 2, 2, 262144),
                                     (ONE_SHOT_LL, 3, 16, 262144)]
  assert "measured" in TUNING_TABLE[0].source
  assert "not measured" in TUNING_TABLE[1].source


# --- thresholds ------------------------------------------------------------------


def _expected(ranks: int, nbytes: int) -> tuple[str, Algorithm | None]:
  """What the table says for (ranks, nbytes), written out for this table."""
  if ranks < 2 or ranks > 16:
    return "world_size", None
  if nbytes > 262144:
    return "size", None
  return "fast_path", ONE_SHOT_LL


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("entry", TUNING_TABLE,
                         ids=[f"{e.min_ranks}-{e.max_ranks}" for e in TUNING_TABLE])
def test_every_threshold_of_every_entry(entry, dtype):
  """One element below, at and one element above each entry's max_bytes
  (at its smallest and largest number of ranks), and one rank below, at and
  above each of its rank bounds (at one element and at max_bytes)."""
  item = dtype.itemsize
  byte_points = (entry.max_bytes - item, entry.max_bytes, entry.max_bytes + item)
  rank_points = (entry.min_ranks - 1, entry.min_ranks, entry.min_ranks + 1,
                 entry.max_ranks - 1, entry.max_ranks, entry.max_ranks + 1)
  cases = [(r, b) for r in (entry.min_ranks, entry.max_ranks) for b in byte_points]
  cases += [(r, b) for r in rank_points for b in (item, entry.max_bytes)]
  for ranks, nbytes in cases:
    c = choose(dtype, nbytes, ranks, max_bytes=CAP)
    assert (c.reason, c.algorithm) == _expected(ranks, nbytes), (ranks, nbytes)
    if entry.min_ranks <= ranks <= entry.max_ranks and nbytes <= entry.max_bytes:
      assert c.algorithm is entry.algorithm
  # The same points, written out for the table as it is.
  assert choose(dtype, 262144 - item, 2, max_bytes=CAP).algorithm is ONE_SHOT_LL
  assert choose(dtype, 262144, 2, max_bytes=CAP).algorithm is ONE_SHOT_LL
  assert choose(dtype, 262144 + item, 2, max_bytes=CAP).reason == "size"
  assert choose(dtype, 262144, 16, max_bytes=CAP).algorithm is ONE_SHOT_LL
  assert choose(dtype, 262144 + item, 16, max_bytes=CAP).reason == "size"
  assert choose(dtype, item, 1, max_bytes=CAP).reason == "world_size"
  assert choose(dtype, item, 17, max_bytes=CAP).reason == "world_size"


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=DTYPE_IDS)
def test_max_bytes_threshold(dtype):
  item = dtype.itemsize
  for cap in (1000, 4096, MAX_BYTES[ONE_SHOT_LL]):
    n = cap - cap % item  # the largest whole number of elements under the cap
    assert choose(dtype, n - item, 2, max_bytes=cap).algorithm is ONE_SHOT_LL
    assert choose(dtype, n, 2, max_bytes=cap).algorithm is ONE_SHOT_LL
    c = choose(dtype, n + item, 2, max_bytes=cap)
    assert (c.reason, c.algorithm) == ("size", None)
    assert str(cap) in c.detail and "JAX_LLAR_MAX_BYTES" in c.detail
  # max_bytes 0 sends every psum to lax.psum.
  assert _reason(dtype, item, 2, max_bytes=0) == "size"


def test_size_without_a_tuning_entry():
  """A table with a gap: payloads and ranks it does not cover are "size"."""
  table = (TuningEntry(ONE_SHOT_LL, 2, 2, 1024, "test"),
           TuningEntry(ONE_SHOT_LL, 4, 8, 64, "test"))
  f32 = np.float32
  assert choose(f32, 1024, 2, max_bytes=CAP, table=table).algorithm is ONE_SHOT_LL
  c = choose(f32, 1028, 2, max_bytes=CAP, table=table)
  assert (c.reason, c.algorithm) == ("size", None)
  assert c.detail == "no tuning entry for 2 ranks and 1028 bytes per rank"
  assert _reason(f32, 4, 3, table=table) == "size"  # no entry for 3 ranks
  assert _reason(f32, 64, 8, table=table) == "fast_path"
  assert _reason(f32, 68, 8, table=table) == "size"
  assert _reason(f32, 4, 9, table=table) == "size"
  assert _reason(f32, 4, 2, table=()) == "size"
  # The first covering entry wins.
  two = (TuningEntry(ONE_SHOT_LL, 2, 4, 64, "first"),
         TuningEntry(ONE_SHOT_LL, 2, 4, 128, "second"))
  assert policy.entry_for(2, 64, two).source == "first"
  assert policy.entry_for(2, 65, two).source == "second"
  assert policy.entry_for(2, 129, two) is None


# --- reasons and their order ---------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.int16, np.int8, np.uint32, np.int64,
                                   np.float64, np.complex64, np.bool_,
                                   ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2,
                                   "int16", "not a dtype"],
                         ids=str)
def test_dtype(dtype):
  c = choose(dtype, 64, 2, max_bytes=CAP)
  assert (c.algorithm, c.reason) == (None, "dtype")
  assert str(dtype) in c.detail


def test_every_reason():
  f32 = np.float32
  expect = {
      "dtype": (np.int16, 64, 2),
      "empty": (f32, 0, 2),
      "mesh": (f32, 64, 0),
      "world_size": (f32, 64, 1),
      "size": (f32, CAP + 4, 2),
      "fast_path": (f32, 64, 2),
  }
  assert tuple(expect) == policy.REASONS
  for reason, (dt, nbytes, ranks) in expect.items():
    c = choose(dt, nbytes, ranks, max_bytes=CAP)
    assert isinstance(c, Choice)
    assert c.reason == reason
    assert (c.algorithm is not None) == (reason == "fast_path")
    assert c.detail
  assert choose(f32, 64, 2, max_bytes=CAP).detail == "one_shot_ll over 2 ranks"
  assert "17" in choose(f32, 64, 17, max_bytes=CAP).detail


def test_order_of_reasons():
  """Each reason wins over every reason after it: an input that fails
  checks i..5 gives reason i."""
  f32, i32 = np.float32, np.int16  # i32: a dtype no kernel serves
  big = CAP + 4
  # dtype before empty, mesh, world_size and size.
  assert _reason(i32, 0, 0) == "dtype"
  assert _reason(i32, big, 1) == "dtype"
  assert _reason(i32, big, 17) == "dtype"
  # empty before mesh and world_size (size cannot fail with 0 bytes).
  assert _reason(f32, 0, 0) == "empty"
  assert _reason(f32, 0, 1) == "empty"
  assert _reason(f32, 0, 17) == "empty"
  assert _reason(f32, 0, 2, max_bytes=0) == "empty"
  # mesh before size.
  assert _reason(f32, big, 0) == "mesh"
  # world_size before size, and before a missing tuning entry.
  assert _reason(f32, big, 1) == "world_size"
  assert _reason(f32, big, 17) == "world_size"
  assert _reason(f32, 4, 1, table=()) == "world_size"
  # size: the cap before the table (the detail tells which).
  c = choose(f32, 2048, 2, max_bytes=1024,
             table=(TuningEntry(ONE_SHOT_LL, 2, 2, 512, "test"),))
  assert c.reason == "size" and "JAX_LLAR_MAX_BYTES" in c.detail


def test_negative_inputs_raise():
  for args in [(-1, 2, CAP), (4, -1, CAP), (4, 2, -1)]:
    with pytest.raises(ValueError, match="negative"):
      choose(np.float32, args[0], args[1], max_bytes=args[2])


def test_policy_is_pure():
  """policy.py and algorithms.py import neither JAX, nor the extension, nor
  logging: the policy cannot probe devices or log."""
  pkg = pathlib.Path(policy.__file__).parent
  for name in ("policy.py", "algorithms.py"):
    tree = ast.parse((pkg / name).read_text())
    modules = set()
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        modules |= {a.name for a in node.names}
      elif isinstance(node, ast.ImportFrom):
        modules.add(node.module or "")
    assert modules <= {"__future__", "dataclasses", "enum", "typing", "numpy",
                       "ml_dtypes", "jax_llar.algorithms"}, (name, modules)


# --- a forced algorithm and the thresholds ---------------------------------------


def test_forced_algorithm_serves_what_it_can():
  one = Algorithm.ONE_SHOT_LL
  limit = MAX_BYTES[one]
  c = choose(np.float32, 64, 2, max_bytes=CAP, force=one)
  assert (c.algorithm, c.reason) == (one, "fast_path") and "forced" in c.detail
  assert choose(np.float32, limit, 9, max_bytes=CAP, force=one).algorithm == one
  c = choose(np.float32, limit + 4, 2, max_bytes=limit + 4, force=one)
  assert (c.algorithm, c.reason) == (None, "size") and "JAX_LLAR_ALGORITHM" in c.detail
  # Forcing never overrides the psum's own reasons or the user's cap.
  assert choose(np.int16, 64, 2, max_bytes=CAP, force=one).reason == "dtype"
  assert choose(np.float32, 64, 1, max_bytes=CAP, force=one).reason == "world_size"
  assert choose(np.float32, 64, 2, max_bytes=32, force=one).reason == "size"


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("ranks", [2, 3, 8, 16])
def test_decision_one_element_around_each_threshold(dtype, ranks):
  """One element below, at and one above every size threshold of the table
  (the entries' max_bytes) and of the cap."""
  item = np.dtype(dtype).itemsize
  served = {e.max_bytes for e in policy.TUNING_TABLE if e.min_ranks <= ranks <= e.max_ranks}
  # The cap is a threshold where the table reaches it.
  thresholds = sorted(served | ({CAP} if CAP <= max(served) else set()))
  for t in thresholds:
    n = t // item  # elements at the threshold
    for elems, fast in ((n - 1, True), (n, True), (n + 1, False)):
      c = choose(dtype, elems * item, ranks, max_bytes=CAP)
      assert (c.algorithm is not None) == fast, (t, elems, c)
      if not fast:
        assert c.reason == "size"


def test_default_max_bytes_is_what_the_table_dispatches():
  """The default cap (config.DEFAULT_MAX_BYTES) is the largest payload of the
  tuning table: raising it dispatches nothing more by itself; a forced
  algorithm that serves more (two_shot_ll) needs JAX_LLAR_MAX_BYTES."""
  from jax_llar import config  # pylint: disable=import-outside-toplevel
  assert config.DEFAULT_MAX_BYTES == max(e.max_bytes for e in TUNING_TABLE)
  two = Algorithm.TWO_SHOT_LL
  assert all(e.algorithm is not two for e in TUNING_TABLE)  # waits for measurements
  big = 1 << 20
  assert choose(np.float32, big, 2, max_bytes=CAP, force=two).algorithm is two
  assert choose(np.float32, big, 2, max_bytes=config.DEFAULT_MAX_BYTES,
                force=two).reason == "size"
  assert choose(np.float32, MAX_BYTES[two] + 4, 2, max_bytes=CAP, force=two).reason == "size"
