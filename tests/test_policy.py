"""The dispatch policy, pure: ``jax_llar.policy.choose`` and tuning tables.

No JAX devices, no fakes, no monkeypatching: the policy is a function of
(dtype, bytes per rank, number of ranks, max_bytes, table, forced
algorithm). Every row boundary of the shipped table and of a synthetic table
with every kind of row is checked one element below, at and one element
above, for every supported dtype; so is the default rule's limit (no
table), the size cap and a forced algorithm's limit; every reason, and the
order in which the reasons are checked. Tables from files, their
precedence, and decisions through the lowering: tests/test_tuning.py.
"""

from __future__ import annotations

import ast
import dataclasses
import pathlib

import ml_dtypes
import numpy as np
import pytest

from jax_llar import policy, tuning
from jax_llar.algorithms import (LARGEST_MAX_BYTES, MAX_BYTES, MAX_RANKS,
                                 SUPPORTED_DTYPES, Algorithm)
from jax_llar.policy import Choice, TableRow, TuningTable, choose

ONE_SHOT_LL = Algorithm.ONE_SHOT_LL
TWO_SHOT_LL = Algorithm.TWO_SHOT_LL
BF16 = np.dtype(ml_dtypes.bfloat16)
CAP = LARGEST_MAX_BYTES
DTYPE_IDS = [str(d) for d in SUPPORTED_DTYPES]
SHIPPED = tuning.load(tuning.SHIPPED_DIR / "sm_90-2ranks.json")

# Every kind of row: a fast path, lax.psum between two fast paths, another
# algorithm up to its limit.
SYNTHETIC = TuningTable("sm_90", 4, (
    TableRow(1024, ONE_SHOT_LL), TableRow(65536, None), TableRow(131072, ONE_SHOT_LL),
    TableRow(MAX_BYTES[TWO_SHOT_LL], TWO_SHOT_LL)), source="synthetic")


def _reason(dtype, nbytes, ranks, max_bytes=CAP, table=None):
  return choose(dtype, nbytes, ranks, max_bytes=max_bytes, table=table).reason


# --- the algorithms --------------------------------------------------------------


def test_algorithm_names_and_ids():
  assert int(ONE_SHOT_LL) == 1
  assert (ONE_SHOT_LL.short_name, ONE_SHOT_LL.impl) == ("one_shot_ll",
                                                        "llar.one_shot_ll")
  assert Algorithm.from_short_name("one_shot_ll") is ONE_SHOT_LL
  with pytest.raises(ValueError, match="one_shot_ll"):
    Algorithm.from_short_name("two_shot")
  assert (MAX_BYTES[ONE_SHOT_LL], MAX_BYTES[TWO_SHOT_LL]) == (262144, 4194304)
  assert LARGEST_MAX_BYTES == max(MAX_BYTES.values())
  assert MAX_RANKS == 16
  assert SUPPORTED_DTYPES == (np.dtype(np.float32), BF16, np.dtype(np.float16),
                              np.dtype(np.int32))
  assert policy.DEFAULT_ALGORITHM is ONE_SHOT_LL


# --- tables: the rules a table must keep ------------------------------------------


@pytest.mark.parametrize("kwargs,message", [
    (dict(architecture="hopper"), "architecture must look like 'sm_90'"),
    (dict(architecture="sm_9"), "architecture must look like 'sm_90'"),
    (dict(ranks=1), "ranks must be an int in 2..16"),
    (dict(ranks=17), "ranks must be an int in 2..16"),
    (dict(ranks=True), "ranks must be an int"),
    (dict(rows=(TableRow(0, ONE_SHOT_LL),)), "row 1: max_bytes must be a positive int"),
    (dict(rows=(TableRow(1.5, ONE_SHOT_LL),)), "row 1: max_bytes must be a positive int"),
    (dict(rows=(TableRow(64, "one_shot_ll"),)), "row 1: algorithm must be an Algorithm"),
    (dict(rows=(TableRow(262148, ONE_SHOT_LL),)),
     "row 1: max_bytes 262148 is above 262144, the most one_shot_ll serves"),
    (dict(rows=(TableRow(64, ONE_SHOT_LL), TableRow(4194308, TWO_SHOT_LL))),
     "row 2: max_bytes 4194308 is above 4194304, the most two_shot_ll serves"),
    (dict(rows=(TableRow(1024, ONE_SHOT_LL), TableRow(512, TWO_SHOT_LL))),
     "row 2: max_bytes 512 is not above row 1's 1024"),
    (dict(rows=(TableRow(1024, ONE_SHOT_LL), TableRow(1024, TWO_SHOT_LL))),
     "row 2: max_bytes 1024 is not above row 1's 1024"),
    (dict(rows=(TableRow(64, ONE_SHOT_LL), TableRow(128, ONE_SHOT_LL))),
     "rows 1 and 2 both choose one_shot_ll: merge them"),
    (dict(rows=(TableRow(64, None), TableRow(128, None), TableRow(256, ONE_SHOT_LL))),
     "rows 1 and 2 both choose lax.psum"),
    (dict(rows=(TableRow(64, ONE_SHOT_LL), TableRow(128, None))),
     "row 2, the last, chooses lax.psum"),
    (dict(rows=((64, ONE_SHOT_LL),)), "row 1 is not a TableRow"),
])
def test_a_table_that_breaks_a_rule_is_refused(kwargs, message):
  args = dict(architecture="sm_90", ranks=2, rows=(TableRow(1024, ONE_SHOT_LL),))
  args.update(kwargs)
  with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
    TuningTable(**args)


def test_well_formed_tables():
  assert SHIPPED.label == "sm_90 x 2 ranks"
  assert SHIPPED.rows == (TableRow(262144, ONE_SHOT_LL), TableRow(4194304, TWO_SHOT_LL))
  # No rows: lax.psum at every size. A lax.psum row first is allowed.
  empty = TuningTable("sm_100", 16, ())
  assert empty.row_for(4) is None
  first = TuningTable("sm_90", 2, (TableRow(64, None), TableRow(128, ONE_SHOT_LL)))
  assert first.row_for(64) == (0, TableRow(64, None))
  assert first.row_for(65) == (1, TableRow(128, ONE_SHOT_LL))
  assert first.row_for(129) is None
  assert SYNTHETIC.describe_row(1) == (
      "row 2 of the tuning table for sm_90 x 4 ranks (1025 to 65536 bytes per "
      "rank: lax.psum; synthetic)")
  assert SYNTHETIC.describe_row(0).startswith(
      "row 1 of the tuning table for sm_90 x 4 ranks (1 to 1024 bytes")


# --- thresholds: every row boundary, the default rule, the cap ------------------------


def _expected(table: TuningTable | None, nbytes: int) -> tuple[str, Algorithm | None]:
  """What `table` says for `nbytes`, from its rows (None: the default rule)."""
  if table is None:
    return ("fast_path", ONE_SHOT_LL) if nbytes <= 262144 else ("size", None)
  for row in table.rows:
    if nbytes <= row.max_bytes:
      return ("fast_path", row.algorithm) if row.algorithm else ("table", None)
  return "size", None


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("table", [SHIPPED, SYNTHETIC], ids=["shipped", "synthetic"])
def test_every_row_boundary(table, dtype):
  """One element below, at and one element above every row's max_bytes."""
  item = dtype.itemsize
  for i, row in enumerate(table.rows):
    n = row.max_bytes // item
    for elems in (n - 1, n, n + 1):
      c = choose(dtype, elems * item, table.ranks, max_bytes=CAP, table=table)
      assert (c.reason, c.algorithm) == _expected(table, elems * item), (i, elems)
      if elems * item <= row.max_bytes:  # the row decided, and says so
        assert f"row {i + 1} of the tuning table for {table.label}" in c.detail


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=DTYPE_IDS)
def test_row_boundaries_written_out(dtype):
  """The same points, written out for the two tables."""
  item = dtype.itemsize

  def at(table, nbytes):
    c = choose(dtype, nbytes, table.ranks, max_bytes=CAP, table=table)
    return c.algorithm if c.algorithm is not None else c.reason

  assert [at(SHIPPED, b) for b in (item, 262144 - item, 262144, 262144 + item,
                                    4194304, 4194304 + item)] == [
      ONE_SHOT_LL, ONE_SHOT_LL, ONE_SHOT_LL, TWO_SHOT_LL, TWO_SHOT_LL, "size"]
  points = [item, 1024 - item, 1024, 1024 + item, 65536, 65536 + item,
            131072, 131072 + item, 4194304, 4194304 + item]
  assert [at(SYNTHETIC, b) for b in points] == [
      ONE_SHOT_LL, ONE_SHOT_LL, ONE_SHOT_LL, "table", "table", ONE_SHOT_LL,
      ONE_SHOT_LL, TWO_SHOT_LL, TWO_SHOT_LL, "size"]


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("ranks", [2, 3, 8, 16])
def test_default_rule_without_a_table(dtype, ranks):
  """No table: the one-shot up to its MAX_BYTES, lax.psum above, and the
  detail says it is the default rule and why there is no table."""
  item = dtype.itemsize
  n = 262144 // item
  for elems, want in ((n - 1, ONE_SHOT_LL), (n, ONE_SHOT_LL), (n + 1, None)):
    c = choose(dtype, elems * item, ranks, max_bytes=CAP,
               no_table=f"no tuning table for sm_90 x {ranks} ranks")
    assert c.algorithm is want
    assert c.reason == ("fast_path" if want else "size")
    assert c.detail.endswith(f"(no tuning table for sm_90 x {ranks} ranks: default rule)")


@pytest.mark.parametrize("dtype", SUPPORTED_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("table", [None, SHIPPED, SYNTHETIC],
                         ids=["default", "shipped", "synthetic"])
def test_max_bytes_caps_every_table(dtype, table):
  """settings.max_bytes is an upper cap over the table's and the default
  rule's choice: one element below and at it the table decides, one above
  it is lax.psum ("size", naming JAX_LLAR_MAX_BYTES)."""
  item = dtype.itemsize
  ranks = table.ranks if table else 2
  for cap in (1000, 4096, 200000, 262144, 3000000):
    n = cap - cap % item  # the largest whole number of elements under the cap
    for nbytes in (n - item, n):
      c = choose(dtype, nbytes, ranks, max_bytes=cap, table=table)
      assert (c.reason, c.algorithm) == _expected(table, nbytes), (cap, nbytes)
    c = choose(dtype, n + item, ranks, max_bytes=cap, table=table)
    assert (c.reason, c.algorithm) == ("size", None)
    assert str(cap) in c.detail and "JAX_LLAR_MAX_BYTES" in c.detail
  # max_bytes 0 sends every psum to lax.psum.
  assert _reason(dtype, item, ranks, max_bytes=0, table=table) == "size"


def test_table_details():
  f32 = np.float32
  c = choose(f32, 2048, 4, max_bytes=CAP, table=SYNTHETIC)
  assert (c.reason, c.algorithm) == ("table", None)
  assert c.detail == ("lax.psum by row 2 of the tuning table for sm_90 x 4 ranks "
                      "(1025 to 65536 bytes per rank: lax.psum; synthetic)")
  # The shipped table's last row is at the size cap, so the cap speaks there;
  # a table whose last row is below the cap names its row (and its file).
  c = choose(f32, 4194308, 2, max_bytes=CAP, table=SHIPPED)
  assert c.reason == "size" and "the size cap, JAX_LLAR_MAX_BYTES" in c.detail
  short = dataclasses.replace(SHIPPED, rows=SHIPPED.rows[:1])
  c = choose(f32, 262148, 2, max_bytes=CAP, table=short)
  assert c.reason == "size" and c.detail.startswith(
      "more than 262144 bytes per rank, the last row of the tuning table for "
      "sm_90 x 2 ranks (")
  assert c.detail.endswith("sm_90-2ranks.json)")
  c = choose(f32, 64, 2, max_bytes=CAP, table=TuningTable("sm_90", 2, ()))
  assert c.detail == "the tuning table for sm_90 x 2 ranks chooses lax.psum at every size"
  with pytest.raises(ValueError, match="sm_90 x 4 ranks was given for a psum over 2"):
    choose(f32, 64, 2, max_bytes=CAP, table=SYNTHETIC)


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
      "dtype": (np.int16, 64, 2, None),
      "empty": (f32, 0, 2, None),
      "mesh": (f32, 64, 0, None),
      "world_size": (f32, 64, 1, None),
      "size": (f32, CAP + 4, 2, None),
      "table": (f32, 2048, 4, SYNTHETIC),
      "fast_path": (f32, 64, 2, None),
  }
  assert tuple(expect) == policy.REASONS
  for reason, (dt, nbytes, ranks, table) in expect.items():
    c = choose(dt, nbytes, ranks, max_bytes=CAP, table=table)
    assert isinstance(c, Choice)
    assert c.reason == reason
    assert (c.algorithm is not None) == (reason == "fast_path")
    assert c.detail
  assert (choose(f32, 64, 2, max_bytes=CAP).detail
          == "one_shot_ll over 2 ranks (no tuning table: default rule)")
  assert "17" in choose(f32, 64, 17, max_bytes=CAP).detail


def test_order_of_reasons():
  """Each reason wins over every reason after it: an input that fails
  checks i..6 gives reason i."""
  f32, i16 = np.float32, np.int16  # i16: a dtype no kernel serves
  big = CAP + 4
  # dtype before empty, mesh, world_size and size.
  assert _reason(i16, 0, 0) == "dtype"
  assert _reason(i16, big, 1) == "dtype"
  assert _reason(i16, big, 17) == "dtype"
  assert _reason(i16, 2048, 4, table=SYNTHETIC) == "dtype"
  # empty before mesh and world_size (size cannot fail with 0 bytes).
  assert _reason(f32, 0, 0) == "empty"
  assert _reason(f32, 0, 1) == "empty"
  assert _reason(f32, 0, 17) == "empty"
  assert _reason(f32, 0, 2, max_bytes=0) == "empty"
  # mesh before size.
  assert _reason(f32, big, 0) == "mesh"
  # world_size before size and the table (a table is for 2..16 ranks).
  assert _reason(f32, big, 1) == "world_size"
  assert _reason(f32, big, 17) == "world_size"
  # size (the cap) before the table's lax.psum row.
  c = choose(f32, 2048, 4, max_bytes=1024, table=SYNTHETIC)
  assert c.reason == "size" and "JAX_LLAR_MAX_BYTES" in c.detail


def test_negative_inputs_raise():
  for args in [(-1, 2, CAP), (4, -1, CAP), (4, 2, -1)]:
    with pytest.raises(ValueError, match="negative"):
      choose(np.float32, args[0], args[1], max_bytes=args[2])


def test_policy_is_pure():
  """policy.py and algorithms.py import neither JAX, nor the extension, nor
  logging, nor file or OS modules: the policy cannot probe devices, read
  tables or log."""
  pkg = pathlib.Path(policy.__file__).parent
  for name in ("policy.py", "algorithms.py"):
    tree = ast.parse((pkg / name).read_text())
    modules = set()
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        modules |= {a.name for a in node.names}
      elif isinstance(node, ast.ImportFrom):
        modules.add(node.module or "")
    assert modules <= {"__future__", "dataclasses", "enum", "re", "typing", "numpy",
                       "ml_dtypes", "jax_llar.algorithms"}, (name, modules)


# --- a forced algorithm ----------------------------------------------------------------


@pytest.mark.parametrize("table", [None, SHIPPED, SYNTHETIC],
                         ids=["default", "shipped", "synthetic"])
def test_forced_algorithm_overrides_the_table(table):
  """A forced algorithm serves every psum it can, whatever the table says
  (also on a lax.psum row and above the last row), up to its own MAX_BYTES
  (one element below, at, above) and under the cap."""
  ranks = table.ranks if table else 2
  for force in Algorithm:
    limit = MAX_BYTES[force]
    for nbytes in (4, 2048, limit - 4, limit):
      c = choose(np.float32, nbytes, ranks, max_bytes=CAP, table=table, force=force)
      assert (c.algorithm, c.reason) == (force, "fast_path"), (force, nbytes)
      assert "forced" in c.detail
    c = choose(np.float32, limit + 4, ranks, max_bytes=limit + 4, table=table,
               force=force)
    assert (c.algorithm, c.reason) == (None, "size")
    assert "JAX_LLAR_ALGORITHM" in c.detail and str(limit) in c.detail
    # Forcing never overrides the psum's own reasons or the user's cap.
    assert choose(np.int16, 64, ranks, max_bytes=CAP, table=table,
                  force=force).reason == "dtype"
    assert choose(np.float32, 64, 1, max_bytes=CAP, force=force).reason == "world_size"
    c = choose(np.float32, 64, ranks, max_bytes=32, table=table, force=force)
    assert c.reason == "size" and "JAX_LLAR_MAX_BYTES" in c.detail


def test_default_max_bytes_is_the_cap():
  """The default cap (config.DEFAULT_MAX_BYTES) is the largest payload any
  algorithm serves: by default the tables and a forced algorithm decide up
  to their own limits; the default rule stops at the one-shot's."""
  from jax_llar import config  # pylint: disable=import-outside-toplevel
  assert config.DEFAULT_MAX_BYTES == config.MAX_BYTES_CAP == CAP
  big = 1 << 20
  assert choose(np.float32, big, 2, max_bytes=config.DEFAULT_MAX_BYTES,
                force=TWO_SHOT_LL).algorithm is TWO_SHOT_LL
  assert choose(np.float32, big, 4, max_bytes=config.DEFAULT_MAX_BYTES,
                table=SYNTHETIC).algorithm is TWO_SHOT_LL
  assert choose(np.float32, big, 2, max_bytes=config.DEFAULT_MAX_BYTES).reason == "size"


def test_a_rows_algorithm_that_refuses_the_dtype_gives_way_to_the_default():
  """A row choosing the sentinel (no int32) leaves int32 psums to the
  default algorithm where it serves the size (one element below, at and one
  above its limit), not to lax.psum; float32 takes the row's choice."""
  sentinel = Algorithm.ONE_SHOT_SENTINEL
  limit = MAX_BYTES[ONE_SHOT_LL]
  table = TuningTable("sm_90", 2, (TableRow(MAX_BYTES[sentinel], sentinel),),
                      source="synthetic")
  for nbytes in (4, limit - 4, limit):
    c = choose(np.int32, nbytes, 2, max_bytes=CAP, table=table)
    assert (c.algorithm, c.reason) == (policy.DEFAULT_ALGORITHM, "fast_path"), nbytes
    assert "int32" in c.detail and "sentinel" in c.detail
    assert "default rule" in c.detail
    c = choose(np.float32, nbytes, 2, max_bytes=CAP, table=table)
    assert (c.algorithm, c.reason) == (sentinel, "fast_path")
  c = choose(np.int32, limit + 4, 2, max_bytes=CAP, table=table)
  assert (c.algorithm, c.reason) == (None, "dtype")


def test_an_algorithm_prints_as_its_name():
  assert str(Algorithm.ONE_SHOT_LL) == "one_shot_ll"
  assert f"{Algorithm.TWO_SHOT_LL128}" == "two_shot_ll128"
  assert [str(a) for a in Algorithm] == [a.short_name for a in Algorithm]
  assert int(Algorithm.TWO_SHOT_LL) == 2 and "%d" % Algorithm.TWO_SHOT_LL == "2"
