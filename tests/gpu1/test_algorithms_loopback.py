"""What every algorithm the loopback harness simulates must do on one GPU
(every rank simulated on it): ``python -m jax_llar.tools.loopback
--algorithm=<name>``, run in this process (loopback_helpers.run_tool), one
test per kind of run, parametrised over the algorithms of `ALGORITHMS`, the
table that holds each algorithm's runs (the tool's flags), what each run
must show and the rule its rows are checked by. A rank left out of a call
and a mispaired call are test_faults_loopback.py's, for every algorithm;
what is one algorithm's own stays in its file (test_sentinel_loopback.py,
test_loopback.py). What passes here is the protocol logic and the
reduction on one GPU's L2, not NVLink: every store is local (tests/gpu is
the 2-GPU suite).

Every run: the tool exits 0; every row passed or was skipped for a reason
the harness states (not a whole number of elements; grids not co-resident;
a dtype the algorithm does not serve); the rows the table names passed;
every row is the algorithm's (impl) and was checked by its rule (bitwise
the float64 rank-order reference for all but the atomic variant, whose rule
is loopback_harness.check_mode's atomic_sum: every rank's output the same
bits, int32 bitwise the reference, every float element within
jax_llar.testing.atomic_sum_violations's bound of the exact sum (NaN,
infinities and overflow as that function states)); every NaN canonical and
every rank's epoch counters advanced once per call (the tool's checks).

The runs:
- test_synchronised: synchronised calls, from epoch 0 and across the
  re-zeroing window (every 2^14 epochs) and the flag wraps, every dtype;
  the kernels for 2, 4 and 8 ranks and the run-time one among the passed
  rows.
- test_ranks_running_ahead_misaligned: no synchronisation between calls
  (ranks run calls ahead of each other: both regions and both halves in use
  at once; the sentinel's re-arming racing the next call's writes of the
  other half), misaligned buffers (the byte-wise path); for the one-shot LL
  and the sentinel the run-time world-size kernel for 2, 4 and 8 ranks too.
- test_large_payloads_synchronised (the two-shot LL and LL128): 1 MiB + 4 B
  and 4 MiB (several steps per thread or line slot, the limit), float32 and
  bfloat16, worlds 2, 3, 4, 20 calls from epoch 0 and from 2^32 - 16 (the
  re-zeroing window and the flag wrap inside the run).
- test_bitwise_the_ll_twin (the LL128s): a child program
  (programs/compare_ll128.py) runs the LL128 and its LL twin on the same
  input sets (random, with special values: signed zeros, subnormals, inf,
  NaN payloads, overflow, cancellation, ties): every output bit of every
  call and rank equal (NaNs by position: which NaN a sum of NaN payloads
  gives depends on the compiled operand order), and the LL128's outputs
  the float64 rank-order reference.

The algorithms:
- one_shot_ll: worlds 2-16 (the specialised kernels for 2, 4, 8 and the
  generic one), every dtype, tails and full lines, 20 calls from epoch 0 and
  from 2^32 - 6 (across the re-zeroing window and the LL flags' 16-bit epoch
  wrap); 40 calls not synchronised on the run-time kernel for 2, 4, 8 and 16
  ranks, 8-byte misaligned buffers, across the re-zeroing window.
- one_shot_ll128: worlds 2-16, every dtype, one element, odd sizes, one
  element either side of the 120-byte line and of 35 lines, beyond the
  one-shot LL's limit and at the LL128's; 20 calls from epoch 0 and from
  2^32 - 16 (across the re-zeroing window and the flag word's 32-bit epoch
  wrap, and the LL flags' 16-bit one); 50 calls not synchronised, 3 bytes
  off 8-byte alignment, across the re-zeroing window; bitwise the one-shot
  LL at line-boundary sizes just below the one-shot LL's limit, aligned and
  misaligned, and not synchronised across the 32-bit wrap.
- one_shot_sentinel: worlds 2-16, the three float dtypes, one element to
  its 512 KiB limit (one 16-bit element, odd tails, one line and a line
  plus one element, a block of 64 lines, grid steps, the one-shot LL's
  limit), from epoch 0 and from an odd epoch (the other half first); int32
  skipped with the reason (refused: test_sentinel_loopback.py); 40 calls
  not synchronised on the run-time kernel, 4 bytes off; its NaN rule, the
  one-shot LL's bits, 16-byte alignment and 1000 calls:
  test_sentinel_loopback.py.
- two_shot_ll: sizes below, at and beyond the one-shot limit up to the
  two-shot's 4 MiB, element and line counts not divisible by the number of
  ranks (chunks of unequal length, payloads of fewer lines than ranks);
  worlds 2, 3, 4, 8, every dtype up to 256 KiB, 50 calls from epoch 0 and
  across the LL flags' 16-bit epoch wrap (and the re-zeroing window just
  before it); above that float32 and bfloat16 stand for the 4- and 2-byte
  element paths, since the step and chunk arithmetic depends on bytes and
  ranks, not on the dtype; 50 calls not synchronised, 8-byte misaligned
  buffers, across the re-zeroing window, up to 1 MiB + 4 B.
- two_shot_ll128: sizes of fewer lines than ranks, odd tails, chunk counts
  not divisible by the number of ranks, one element either side of a
  multiple of the 120-byte line, several steps per line slot (2 ranks: above
  2 x 4096 lines), the 4 MiB limit; every dtype up to 480 KiB, float32 and
  bfloat16 above (the step and chunk arithmetic depends on bytes and ranks,
  not the dtype); 20 calls from epoch 0 and across the flag word's 32-bit
  epoch wrap (from 2^32 - 16, inside the 20 calls); 50 calls not
  synchronised at worlds 2, 3, 5, misaligned, across the re-zeroing window;
  bitwise the two-shot LL at worlds 2, 3, 5, 8.
- two_shot_ll128_atomic: not deterministic, so checked by its rule; two
  short runs: worlds 2, 3, 4, 8, every dtype, 6 calls from 2^32 - 4 (the
  re-zeroing epochs and the flag wrap inside the run), 4 B (fewer lines than
  ranks), 6 B, 124 B, 4204 B (35 lines + 4 B), 65540 B, random inputs with
  special values; then 8 calls not synchronised (both accumulator halves in
  use at once), 4 bytes off alignment, worlds 2, 3, 5, up to the 4 MiB limit
  (several steps per line slot: 1 MiB and 4 MiB at 2 ranks, 4 MiB at 3).
  Its 2-GPU checks: tests/gpu/test_algorithms.py and
  tests/gpu/test_two_shot_ll128_atomic.py.

With JAX_LLAR_GPU1_RESULTS=DIR each run's JSON record is also copied to
DIR/<algorithm>-<run>.json (the sentinel's: DIR/sentinel-matrix.json and
DIR/sentinel-nosync-generic.json).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from jax_llar.tools.loopback import harness as lh

from loopback_helpers import ALLOWED_SKIPS, compare, grid, passed, problems, run_tool, statuses

DTYPES = ("float32", "bfloat16", "float16", "int32")
F32, BF16, F16, I32 = DTYPES
ALL_DTYPES_FLAG = "--dtypes=" + ",".join(DTYPES)
# The kernels a synchronised run holds among its passed rows: the specialised
# ones for 2, 4 and 8 ranks and the run-time one.
KERNELS = frozenset({(2, "world 2"), (4, "world 4"), (8, "world 8"), (3, "generic")})
KERNELS_16 = KERNELS | {(16, "generic")}


@dataclasses.dataclass(frozen=True)
class Run:
  """One loopback tool run (its flags, --algorithm aside) and what its
  record must show beyond what every run must."""
  flags: tuple[str, ...]
  must_pass: frozenset  # (world, dtype, bytes per rank, start epoch) rows that pass
  kernels: frozenset = frozenset()  # (world, kernel) among the passed rows
  statuses: dict | None = None  # the exact rows per status, where stated
  all_generic: bool = False  # every passed row ran the run-time world-size kernel
  min_steps: int = 0  # the most steps per thread (line slot) of a passed row, at least
  keep_as: str | None = None  # the record's name in JAX_LLAR_GPU1_RESULTS


@dataclasses.dataclass(frozen=True)
class Twin:
  """A programs/compare_ll128.py run against the LL twin."""
  cases: tuple  # [world, dtype, bytes per rank, misalign, start epoch] each
  calls: int
  sync: bool = True
  seed: int = 0
  may_skip: int | None = None  # cases that may be skipped (grids that do not fit)
  covered: frozenset = frozenset()  # (world, dtype) that must have passed


@dataclasses.dataclass(frozen=True)
class Algo:
  """An algorithm's row of the table."""
  synchronised: Run
  running_ahead: Run
  rule: str = lh.BITWISE  # the rule its rows are checked by (lh.check_mode's names)
  large: Run | None = None  # test_large_payloads_synchronised
  twin: str | None = None  # the LL twin (test_bitwise_the_ll_twin)
  twin_runs: tuple[Twin, ...] = ()
  unserved: tuple[str, ...] = ()  # dtypes it refuses: every row skipped, ...
  unserved_reason: str = ""  # ... with this reason where the size is whole elements


def _ll128_twin_cases():
  """Every dtype at worlds 2-16: one and three elements, one element either
  side of 1, 33 and 2184 lines (2184: just below the one-shot LL's limit),
  misaligned where the size is no multiple of 3."""
  itemsize = {F32: 4, BF16: 2, F16: 2, I32: 4}
  cases = []
  for world in (2, 3, 4, 8, 16):
    for dtype, s in itemsize.items():
      sizes = {s, 3 * s}
      for k in (1, 33, 2184):
        sizes |= {120 * k - s, 120 * k, 120 * k + s}
      for n in sorted(sizes):
        cases.append((world, dtype, n, 0 if n % 3 else 5, 0))
  return tuple(cases)


def _two_shot_twin_cases():
  """float32, bfloat16 and int32 at worlds 2, 3, 5, 8: one element, one
  element short of a line, 7 lines and one, one element either side of 4097
  and 8193 lines (several steps per slot)."""
  cases = []
  for world in (2, 3, 5, 8):
    for dtype, s in ((F32, 4), (BF16, 2), (I32, 4)):
      for n in (s, 120 - s, 120 * 7 + s, 120 * 4097 - s, 120 * 8193 + s):
        cases.append((world, dtype, n, 0 if n % 3 else 4, 0))
  return tuple(cases)


def _sentinel_matrix():
  """The sentinel's synchronised rows that must pass: whole elements, up to
  256 KiB below 8 ranks and 64 KiB from 8, and its 512 KiB limit at 2."""
  sizes = (2, 6, 16, 18, 100, 1024, 4100, 65536, 262144, 524288)
  rows = {(w, d, n, e) for w in (2, 3, 4, 5, 8, 16) for d in (F32, BF16, F16) for n in sizes
          for e in (0, 4294967295)
          if not (n % (4 if d == F32 else 2) or n > (262144 if w < 8 else 65536))}
  return frozenset(rows | {(2, F32, 524288, 0), (2, BF16, 524288, 4294967295)})


# The two-shots' large payloads: the same run for the LL and the LL128.
_TWO_SHOT_LARGE = Run(
    ("--worlds=2,3,4", "--dtypes=float32,bfloat16", "--sizes=1048580,4194304", "--calls=20",
     "--sets=2", "--start_epochs=0,4294967280"),
    grid((2, 3, 4), (F32, BF16), (1048580,), (0, 4294967280))
    | grid((2,), (F32, BF16), (4194304,), (0, 4294967280)),
    min_steps=2)

ALGORITHMS = {
    "one_shot_ll": Algo(
        synchronised=Run(
            ("--worlds=2,3,4,5,8,16", ALL_DTYPES_FLAG, "--sizes=4,6,100,4096,65536",
             "--calls=20", "--start_epochs=0,4294967290"),
            # 6 bytes is no whole number of 4-byte elements: skipped for float32, int32.
            grid((2, 3, 4, 5, 8, 16), DTYPES, (4, 6, 100, 4096, 65536), (0, 4294967290))
            - grid((2, 3, 4, 5, 8, 16), (F32, I32), (6,), (0, 4294967290)),
            kernels=KERNELS_16,
            statuses={"pass": 6 * 4 * 5 * 2 - 6 * 2 * 2, "skipped": 6 * 2 * 2}),
        running_ahead=Run(
            ("--worlds=2,4,8,16", "--dtypes=float32,bfloat16", "--sizes=100,4096,98304",
             "--calls=40", "--no_sync", "--generic", "--misalign=4",
             "--start_epochs=0,1073741800"),
            grid((2, 4, 8, 16), (F32, BF16), (100, 4096, 98304), (0, 1073741800)),
            statuses={"pass": 4 * 2 * 3 * 2}, all_generic=True)),
    "one_shot_ll128": Algo(
        synchronised=Run(
            ("--worlds=2,3,4,5,8,16", ALL_DTYPES_FLAG,
             "--sizes=4,6,116,118,120,122,124,4196,4200,4204,98304,491520", "--calls=20",
             "--start_epochs=0,4294967280"),
            grid((2, 3, 4, 5, 8), DTYPES, (4, 116, 120, 124, 4196, 4200, 4204, 98304),
                 (0, 4294967280))
            | grid((2, 3, 4, 5, 8), (BF16, F16), (6, 118, 122), (0, 4294967280))
            | grid((2,), (F32,), (491520,), (0,))
            | grid((16,), (BF16,), (4, 6, 118, 120, 122, 4200), (0,)),
            kernels=KERNELS_16),
        running_ahead=Run(
            ("--worlds=2,3,8,16", "--dtypes=float32,bfloat16", "--sizes=100,4200,65540",
             "--calls=50", "--no_sync", "--misalign=3", "--start_epochs=0,1073741800"),
            grid((2, 3, 8, 16), (F32,), (100, 4200, 65540), (0, 1073741800))),
        twin="one_shot_ll",
        twin_runs=(
            # Everything but the largest sizes at 16 ranks fits on one GPU.
            Twin(_ll128_twin_cases(), calls=6, may_skip=4 * 3 * 2),
            Twin(tuple((w, BF16, 4200, 1, 4294967290) for w in (2, 5, 8)), calls=12,
                 sync=False, seed=1, may_skip=0))),
    "one_shot_sentinel": Algo(
        synchronised=Run(
            ("--worlds=2,3,4,5,8,16", ALL_DTYPES_FLAG,
             "--sizes=2,6,16,18,100,1024,4100,65536,262144,524288", "--calls=12",
             "--start_epochs=0,4294967295", "--canonical_nan"),
            _sentinel_matrix(), kernels=KERNELS_16, keep_as="sentinel-matrix"),
        running_ahead=Run(
            ("--worlds=2,4,8,16", "--dtypes=float32,bfloat16",
             "--sizes=100,4100,65536,262144", "--calls=40", "--no_sync", "--generic",
             "--misalign=4", "--start_epochs=0,7"),
            grid((2, 4, 8, 16), (F32,), (100, 4100, 65536), (7,)), all_generic=True,
            keep_as="sentinel-nosync-generic"),
        unserved=(I32,), unserved_reason="float32, bfloat16 and float16 only"),
    "two_shot_ll": Algo(
        synchronised=Run(
            ("--worlds=2,3,4,8", ALL_DTYPES_FLAG, "--sizes=4,6,100,4100,65540,262148",
             "--calls=50", "--start_epochs=0,4294967270"),
            grid((2, 3, 4), DTYPES, (4, 100, 4100, 65540, 262148), (0, 4294967270))
            | grid((8,), (F32,), (4, 100, 4100, 65540, 262148), (0,)),
            kernels=KERNELS),
        large=_TWO_SHOT_LARGE,
        running_ahead=Run(
            ("--worlds=2,3,4,8", "--dtypes=float32,bfloat16",
             "--sizes=4,6,100,4100,65540,262148,1048580", "--calls=50", "--sets=2",
             "--no_sync", "--misalign=4", "--start_epochs=0,1073741800"),
            grid((2, 3, 4), (F32,), (4, 100, 4100, 65540, 262148, 1048580), (1073741800,)))),
    "two_shot_ll128": Algo(
        synchronised=Run(
            ("--worlds=2,3,4,8", ALL_DTYPES_FLAG, "--sizes=4,6,124,4204,65540,491524",
             "--calls=20", "--start_epochs=0,4294967280"),
            grid((2, 3, 4), DTYPES, (4, 124, 4204, 65540, 491524), (0, 4294967280))
            | grid((8,), (F32,), (4, 124, 4204, 65540), (0,)),
            kernels=KERNELS),
        large=_TWO_SHOT_LARGE,
        running_ahead=Run(
            ("--worlds=2,3,5", "--dtypes=float32,bfloat16",
             "--sizes=4,6,124,4204,65540,491524,1048580", "--calls=50", "--sets=2",
             "--no_sync", "--misalign=4", "--start_epochs=0,1073741800"),
            grid((2, 3, 5), (F32,), (4, 124, 4204, 65540, 491524, 1048580), (1073741800,))),
        twin="two_shot_ll",
        twin_runs=(Twin(_two_shot_twin_cases(), calls=4,
                        covered=frozenset((w, d) for w in (2, 3, 5) for d in (F32, BF16, I32))),)),
    "two_shot_ll128_atomic": Algo(
        synchronised=Run(
            ("--worlds=2,3,4,8", ALL_DTYPES_FLAG, "--sizes=4,6,124,4204,65540", "--calls=6",
             "--sets=3", "--start_epochs=4294967292"),
            grid((2, 3, 4, 8), DTYPES, (4, 124, 4204, 65540), (4294967292,))
            | grid((2, 3, 4, 8), (BF16, F16), (6,), (4294967292,)),
            kernels=KERNELS),
        running_ahead=Run(
            ("--worlds=2,3,5", "--dtypes=float32,bfloat16", "--sizes=124,65540,1048580,4194304",
             "--calls=8", "--sets=3", "--no_sync", "--misalign=4", "--start_epochs=0"),
            grid((2, 3, 5), (F32, BF16), (124, 65540, 1048580), (0,))
            | {(2, F32, 4194304, 0), (3, BF16, 4194304, 0)},
            min_steps=3),
        rule=lh.ATOMIC_SUM),
}


def _check_run(tmp_path, name: str, kind: str, run: Run):
  """Runs `run` of algorithm `name` and asserts what every run must show
  and what `run` adds."""
  a = ALGORITHMS[name]
  rc, record, tail = run_tool(tmp_path, f"--algorithm={name}", *run.flags,
                              keep_as=run.keep_as or f"{name}-{kind}")
  assert record is not None, tail
  allowed = ALLOWED_SKIPS + ((a.unserved_reason,) if a.unserved else ())
  assert rc == 0 and not problems(record, allowed), (problems(record, allowed)[:3], tail)
  rows = record["rows"]
  ok = passed(record)
  assert run.must_pass <= ok, (sorted(run.must_pass - ok)[:5], tail)
  assert all(r["impl"] == f"loopback.{name}" for r in rows)
  assert "not NVLink" in record["note"]
  # The rule every row that ran was checked by.
  rule = a.rule
  ran = [r for r in rows if r["status"] in ("pass", "fail")]
  assert ran
  for r in ran:
    assert r["check"] == rule, r
    if rule == lh.ATOMIC_SUM:
      assert r["ranks_bitwise_equal"], r
      if r["dtype"] == I32:
        assert r["differing_from_reference"] == 0, r
  good = [r for r in rows if r["status"] == "pass"]
  assert run.kernels <= {(r["world_size"], r["kernel"]) for r in good}, tail
  if run.statuses is not None:
    assert statuses(record) == run.statuses, tail
  if run.all_generic:
    assert all(r["kernel"] == "generic" for r in good)
  if run.min_steps:
    steps = {r["plan"]["steps"] for r in good}
    assert max(steps) >= run.min_steps, steps
  dtypes = next(f for f in run.flags if f.startswith("--dtypes=")).split("=")[1].split(",")
  for d in a.unserved:
    if d in dtypes:
      refused = [r for r in rows if r["dtype"] == d]
      assert refused and all(r["status"] == "skipped" for r in refused)
      assert all(a.unserved_reason in r["reason"] for r in refused
                 if r["bytes_per_rank"] % np.dtype(d).itemsize == 0)


def _where(field):
  return [name for name, a in ALGORITHMS.items() if getattr(a, field)]


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_synchronised(tmp_path, name):
  """The algorithm's synchronised matrix (the module's docstring)."""
  _check_run(tmp_path, name, "synchronised", ALGORITHMS[name].synchronised)


@pytest.mark.parametrize("name", _where("large"))
def test_large_payloads_synchronised(tmp_path, name):
  """1 MiB + 4 B and 4 MiB: several steps per thread or line slot, the limit."""
  _check_run(tmp_path, name, "large", ALGORITHMS[name].large)


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_ranks_running_ahead_misaligned(tmp_path, name):
  """Calls not synchronised (ranks run calls ahead), misaligned buffers."""
  _check_run(tmp_path, name, "running-ahead", ALGORITHMS[name].running_ahead)


@pytest.mark.parametrize("name", _where("twin"))
def test_bitwise_the_ll_twin(name):
  """The LL128 and its LL twin on the same inputs: every output bit equal
  (NaNs by position), and the LL128's the rank-order reference."""
  a = ALGORITHMS[name]
  for run in a.twin_runs:
    rows, tail = compare(run.cases, calls=run.calls, sync=run.sync, seed=run.seed,
                         algorithms=(a.twin, name))
    assert len(rows) == len(run.cases), tail
    bad = [r for r in rows if r["status"] not in ("pass", "skipped")]
    assert not bad, bad[:3]
    good = [r for r in rows if r["status"] == "pass"]
    assert all(r["equal"] and r["reference"] for r in good)
    if run.may_skip is not None:
      assert len(good) >= len(run.cases) - run.may_skip, [r for r in rows if r["status"] != "pass"]
    assert run.covered <= {(r["world_size"], r["dtype"]) for r in good}, tail
