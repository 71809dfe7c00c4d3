"""The two-shot LL128 atomic all-reduce's host-side rules, on CPU: the
atomic-sum rule (jax_llar.testing.atomic_sum_bound / atomic_sum_violations)
against a numpy model of the kernel's arithmetic, the rule's sensitivity, the
loopback harness's check mode and fault verdict for it, its region and id,
and that no tuning table can choose it while JAX_LLAR_ALGORITHM can force it.

The kernel itself needs a GPU: tests/gpu1/test_algorithms_loopback.py (one GPU,
ranks simulated; -k two_shot_ll128_atomic) and tests/gpu/test_algorithms.py with
tests/gpu/test_two_shot_ll128_atomic.py (2 GPUs).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from jax_llar import algorithms, config, policy, testing, tuning
from jax_llar.algorithms import Algorithm
from jax_llar.tools.bench import kernel_level as kernel_level
from jax_llar.tools.tune import tables as tune_tables
from jax_llar.tools.loopback import harness as lh

from cpu_helpers import user_env
from test_tools_loopback import CODES, FakeNative
from test_tuning import PROVENANCE, _results, _row

ROOT = pathlib.Path(__file__).resolve().parent.parent
ATOMIC = Algorithm.TWO_SHOT_LL128_ATOMIC
BF16 = np.dtype(ml_dtypes.bfloat16)
FLOATS = (np.dtype(np.float32), BF16, np.dtype(np.float16))
UINT = {2: np.uint16, 4: np.uint32}
F32_SMALLEST_NORMAL = np.float32(2.0 ** -126)


# --- a model of the kernel's arithmetic (two_shot_ll128_atomic.cuh) ----------------


def _flush(v: np.ndarray) -> np.ndarray:
  """red.add.f32 on global memory: subnormals to sign-preserving zero."""
  return np.where(np.abs(v) < F32_SMALLEST_NORMAL, np.copysign(np.float32(0), v), v)


def atomic_model(x: np.ndarray, owner: int, order, dtype) -> np.ndarray:
  """What the owner `owner` outputs for the ranks' inputs x (world, n): the
  peers' values added into a +0.0 float32 accumulator in `order` (ranks,
  the owner left out) by red.add.f32 (flushing), then the owner's own value
  added in registers (float32, round to nearest even, no flush), rounded
  once to `dtype`, NaNs canonical; int32: the sum modulo 2^32."""
  dtype = np.dtype(dtype)
  if dtype == np.dtype(np.int32):
    return testing.rank_order_sum(list(x), dtype)
  xs = x.astype(np.float32)
  acc = np.zeros(x.shape[1], np.float32)
  with np.errstate(over="ignore", invalid="ignore"):
    for r in order:
      acc = _flush((acc + _flush(xs[r])).astype(np.float32))
    acc = (acc + xs[owner]).astype(np.float32)
    out = acc.astype(dtype)
  nan = np.isnan(out.astype(np.float32))
  bits = out.view(UINT[dtype.itemsize])
  bits[nan] = lh.CANONICAL_NAN[dtype]
  return out


def _orders(rng, world, owner, k):
  peers = [r for r in range(world) if r != owner]
  return [list(rng.permutation(peers)) for _ in range(k)]


@pytest.mark.parametrize("world", [2, 3, 4, 8, 16])
@pytest.mark.parametrize("dtype", FLOATS + (np.dtype(np.int32),), ids=str)
def test_the_model_keeps_the_rule_on_random_and_special_inputs(dtype, world):
  """Random inputs of mixed magnitudes and the loopback harness's special
  columns (signed zeros, subnormals, inf, NaN payloads, overflow,
  cancellation, ties), every owner, several arrival orders: no element
  breaks the rule; int32 is bitwise the reference."""
  rng = np.random.default_rng(world)
  name = {v: k for k, v in lh.DTYPES.items() if len(k) > 3}[dtype]
  case = lh.Case(world, name, 4096 * dtype.itemsize)
  x = lh.make_inputs(rng, case, 2, specials=True)
  scale = rng.choice([1.0, 1e3, 1e-3], size=case.n_elems)
  if dtype != np.dtype(np.int32):
    x[0] = (x[0].astype(np.float32) * scale.astype(np.float32)).astype(dtype)
  for s in range(2):
    for owner in range(world):
      for order in _orders(rng, world, owner, 3):
        got = atomic_model(x[s], owner, order, dtype)
        bad = testing.atomic_sum_violations(got, list(x[s]), dtype)
        assert not bad.any(), (s, owner, order, np.flatnonzero(bad)[:5])
        if dtype == np.dtype(np.int32):
          assert np.array_equal(got, testing.rank_order_sum(list(x[s]), dtype))


def test_where_the_arrival_order_matters():
  """Why the rule is needed: from 4 ranks (3 peers) on, float32 arrival
  orders give other bits for some elements; at 3 ranks the order of the two
  peers cannot matter (the first add into +0.0 is exact, the second is
  commutative) but the result, two roundings, is not always the rank-order
  reference's one rounding; at 2 ranks it is the correctly rounded sum, so
  the reference's bits."""
  rng = np.random.default_rng(0)
  x = np.stack([testing.random_array(rng, (4096,), np.float32) for _ in range(4)])
  a = atomic_model(x, 0, [1, 2, 3], np.float32)
  b = atomic_model(x, 0, [3, 2, 1], np.float32)
  assert not np.array_equal(a.view(np.uint32), b.view(np.uint32))
  three = x[:3]
  a = atomic_model(three, 0, [1, 2], np.float32)
  assert np.array_equal(a.view(np.uint32),
                        atomic_model(three, 0, [2, 1], np.float32).view(np.uint32))
  assert not np.array_equal(a.view(np.uint32),
                            testing.rank_order_sum(list(three), np.float32).view(np.uint32))
  two = x[:2]
  assert np.array_equal(atomic_model(two, 1, [0], np.float32).view(np.uint32),
                        testing.rank_order_sum(list(two), np.float32).view(np.uint32))


def test_the_bound_formula():
  """gamma_{w-1} S with u = 2^-24 plus the flush term (float32); the 16-bit
  dtypes add their own rounding of the float32 sum."""
  x = [np.array([1.0, 3.0], np.float32), np.array([2.0, -3.0], np.float32),
       np.array([4.0, 0.0], np.float32)]
  e, bound, overflow = testing.atomic_sum_bound(x, np.float32)
  gamma = 2 * 2.0 ** -24 / (1 - 2 * 2.0 ** -24)
  s = np.array([7.0, 6.0])
  np.testing.assert_allclose(e, [7.0, 0.0])
  np.testing.assert_allclose(bound, gamma * s + 4 * 2.0 ** -126 + 3 * 2.0 ** -53 * s,
                             rtol=1e-15)
  assert not overflow.any()
  _, b16, _ = testing.atomic_sum_bound([v.astype(BF16) for v in x], BF16)
  tiny = float(ml_dtypes.finfo(BF16).smallest_subnormal)
  np.testing.assert_allclose(b16, bound + 2.0 ** -8 * (np.abs(e) + bound) + tiny / 2,
                             rtol=1e-15)
  with pytest.raises(ValueError, match="int32"):
    testing.atomic_sum_bound([np.zeros(2, np.int32)] * 2, np.int32)


def _v(dtype, *values):
  return np.array(values, np.float64).astype(dtype)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_the_rule_rejects_what_it_must(dtype):
  """Each clause of the rule, accepted and rejected."""
  f = ml_dtypes.finfo(dtype)

  def bad(got, *inputs):
    return bool(testing.atomic_sum_violations(_v(dtype, got), [_v(dtype, i) for i in inputs],
                                              dtype)[0])

  big = float(f.max)
  # Finite: within the bound or not (1 + eps/8: 1.0 is within, 1 + 8 eps is not).
  eps = float(f.eps)
  assert not bad(1.0, 1.0, eps / 8)
  assert bad(1.0 + 8 * eps, 1.0, eps / 8)
  assert bad(2.5, 1.0, 1.0)
  assert not bad(2.0, 1.0, 1.0)
  # A zero's sign is not kept.
  assert not bad(0.0, -0.0, -0.0) and not bad(-0.0, 0.0, -0.0)
  # NaN: expected from a NaN input or from +inf and -inf, and only there.
  assert not bad(np.nan, 1.0, np.nan) and bad(1.0, 1.0, np.nan)
  assert not bad(np.nan, np.inf, -np.inf) and bad(np.inf, np.inf, -np.inf)
  assert bad(np.nan, 1.0, 2.0)
  # One infinity: that infinity (the other one is wrong when no overflow).
  assert not bad(np.inf, np.inf, 1.0)
  assert bad(-np.inf, np.inf, 1.0) and bad(1.0, np.inf, 1.0)
  # Overflow possible (the two largest values): an infinity is allowed, so
  # is a finite sum within the bound; not NaN (finite inputs).
  assert not bad(np.inf, big, big)
  assert not bad(np.inf, big, big, -big) and not bad(big, big, big, -big)
  assert bad(np.nan, big, big, -big)
  # No overflow possible: an infinity is wrong.
  assert bad(np.inf, 1.0, 1.0)


def test_the_rule_int32_is_exact_and_wraps():
  i = np.iinfo(np.int32)
  x = [np.array([i.max, 5, -1], np.int32), np.array([1, 7, -1], np.int32)]
  ok = np.array([i.min, 12, -2], np.int32)
  assert not testing.atomic_sum_violations(ok, x, np.int32).any()
  assert testing.atomic_sum_violations(ok + np.int32(1), x, np.int32).all()


def test_the_rule_float32_subnormals_flushed_are_within_the_bound():
  tiny = np.float32(2.0 ** -149)
  for world in (2, 3, 8, 16):
    x = [np.array([tiny, -tiny], np.float32)] * world
    assert not testing.atomic_sum_violations(np.array([0.0, -0.0], np.float32), x,
                                             np.float32).any()


# --- the loopback harness's check of it --------------------------------------------------


@pytest.fixture
def fake_run(monkeypatch):
  """lh.run against a stand-in of the native module (as test_tools_loopback's)."""
  monkeypatch.setattr(lh.report, "environment", lambda: {"stub": True})

  def run(fake, settings, **kw):
    monkeypatch.setattr(lh._native, "require", lambda what: fake)  # pylint: disable=W0212
    return lh.run(settings, **kw)

  return run


class AtomicFake(FakeNative):
  """The native loopback API, computed with `atomic_model`: every call a new
  arrival order (every owner of a chunk the same order for all its
  elements), all ranks the owner's bits; optionally rank 1 of the last call
  given another valid order (`split_ranks`) or one element far off."""

  def __init__(self, split_ranks=False, far_off=None, seed=0, **kw):
    super().__init__(**kw)
    self.split_ranks, self.far_off = split_ranks, far_off
    self.rng = np.random.default_rng(seed)

  def loopback(self, raw, dtype, calls, *, sync=True, keep=0, algorithm=1, generic=False,
               block_lines=0, timeout_ms=2000.0, start_epoch=0, misalign=0, ordinal=0,
               skip_rank=-1, skip_call=0):
    r = super().loopback(raw, dtype, calls, sync=sync, keep=keep, algorithm=algorithm,
                         generic=generic, block_lines=block_lines, timeout_ms=timeout_ms,
                         start_epoch=start_epoch, misalign=misalign, ordinal=ordinal)
    np_dtype = lh.DTYPES[{v: k for k, v in CODES.items()}[dtype]]
    x = raw.view(np_dtype)
    sets, world = x.shape[0], x.shape[1]
    keep = keep or calls
    out = np.empty((keep, world, x.shape[2]), np_dtype)
    for k in range(keep):
      call = calls - keep + k
      owner = int(self.rng.integers(world))
      order = _orders(self.rng, world, owner, 1)[0]
      out[k] = atomic_model(x[call % sets], owner, order, np_dtype)[None, :]
      if self.split_ranks and k == keep - 1:
        out[k, 1] = atomic_model(x[call % sets], owner, order[::-1], np_dtype)
    if self.far_off is not None:
      k, rank, i = self.far_off
      out[k, :, i] = (out[k, :, i].astype(np.float64) * 1.5 + 1.0).astype(np_dtype)
    r["outputs"] = out.view(np.uint8).reshape(keep, world, -1)
    return r


ATOMIC_SETTINGS = lh.Settings(worlds=(2, 3, 4), dtypes=("float32", "bfloat16", "float16",
                                                         "int32"),
                              sizes=(8, 4096), calls=6, keep=4, sets=3,
                              algorithm="two_shot_ll128_atomic")


def test_check_mode_follows_non_determinism():
  assert algorithms.NON_DETERMINISTIC == frozenset({ATOMIC})
  assert lh.check_mode("two_shot_ll128_atomic") == lh.ATOMIC_SUM
  assert {lh.check_mode(a.short_name) for a in Algorithm if a is not ATOMIC} == {lh.BITWISE}
  assert "two_shot_ll128_atomic" in lh.ALGORITHMS
  assert kernel_level.KERNEL_IMPLS[ATOMIC.impl].expect == kernel_level.ATOMIC_SUM
  assert kernel_level.KERNEL_IMPLS[Algorithm.TWO_SHOT_LL128.impl].expect == kernel_level.SUM


def test_run_checks_the_atomic_rule_and_identical_ranks(fake_run):
  result = fake_run(AtomicFake(), ATOMIC_SETTINGS)
  rows = result["rows"]
  assert lh.summary(rows) == {"pass": 24}, [r for r in rows if r["status"] != "pass"][:2]
  assert all(r["check"] == lh.ATOMIC_SUM and r["ranks_bitwise_equal"] for r in rows)
  assert all(r["differing_from_reference"] == 0 for r in rows if r["dtype"] == "int32")
  # The rule, not bitwise equality: some 3- and 4-rank float32 sums differ
  # from the rank-order reference and pass.
  assert any(r["differing_from_reference"] > 0 for r in rows
             if r["dtype"] == "float32" and r["world_size"] > 2)
  json.dumps(result)


def test_run_fails_on_ranks_that_differ_or_a_sum_off_the_bound(fake_run):
  s = dataclasses.replace(ATOMIC_SETTINGS, worlds=(4,), dtypes=("float32",), sizes=(4096,))
  row = fake_run(AtomicFake(split_ranks=True), s)["rows"][0]
  assert row["status"] == "fail" and row["ranks_bitwise_equal"] is False
  row = fake_run(AtomicFake(far_off=(2, 0, 77)), s)["rows"][0]
  assert row["status"] == "fail"
  m = row["first_mismatch"]
  assert (m["call"], m["index"]) == (4, 77) and m["bound"] > 0 and "exact" in m
  # A bitwise check would fail the valid non-deterministic outputs of the
  # same fake: the mode matters.
  bitwise = dataclasses.replace(s, algorithm="two_shot_ll128")
  row = fake_run(AtomicFake(), bitwise)["rows"][0]
  assert row["check"] == lh.BITWISE and row["status"] == "fail"


def test_validate_refuses_a_bitwise_comparison_with_it():
  s = dataclasses.replace(ATOMIC_SETTINGS, bitwise_against="two_shot_ll128")
  assert any("non-deterministic" in e for e in lh.validate(s))
  s = dataclasses.replace(ATOMIC_SETTINGS, algorithm="two_shot_ll128",
                          bitwise_against="two_shot_ll128_atomic")
  assert any("non-deterministic" in e for e in lh.validate(s))
  assert lh.validate(ATOMIC_SETTINGS) == []


def _atomic_fault(skip_rank=2, world=4):
  spec = lh.fault_spec(dataclasses.replace(ATOMIC_SETTINGS, calls=6, timeout_ms=1000),
                       lh.Case(world, "float32", 4204, 100), skip_rank, 3)
  epoch = 103
  records = []
  for i in range(world):
    r = dict(code=0, rank=0, peer=0, block=0, line=0, flag_expected=0, flag_seen=0,
             flag_seen2=0, epoch=0, waited_ns=0)
    if i != skip_rank:
      mask = lh.arrival_mask(world, i)
      r.update(code=1, rank=i, peer=skip_rank, block=0, line=5, flag_expected=mask,
               flag_seen=mask & ~(1 << skip_rank), epoch=epoch, waited_ns=1_000_400_000)
    records.append(r)
  data = {"calls_launched": 4, "failed_call": 3, "deadline_exceeded": False,
          "cuda_error": "cudaErrorLaunchFailure: unspecified launch failure",
          "seconds_to_error": 1.3, "records": records}
  return spec, data


def test_fault_verdict_for_the_arrival_wait():
  assert lh.arrival_mask(4, 1) == 0b1101 and lh.arrival_mask(16, 0) == 0xFFFE
  spec, data = _atomic_fault()
  assert lh.fault_problems(spec, data) == []
  # A rank waiting in the all-gather: the epoch's flag and a chunk owner.
  data["records"][0].update(flag_expected=(103 & 0xFFFFFFFF) | 1, flag_seen=0, peer=3)
  assert lh.fault_problems(spec, data) == []
  # The skipped rank's bit seen, or another peer named: wrong.
  spec, data = _atomic_fault()
  data["records"][1]["flag_seen"] |= 1 << 2
  assert any("arrival mask" in p for p in lh.fault_problems(spec, data))
  spec, data = _atomic_fault()
  data["records"][3]["peer"] = 0
  assert any("arrival mask" in p for p in lh.fault_problems(spec, data))


# --- id, region, dtypes -----------------------------------------------------------------


def test_id_limit_dtypes_and_region():
  assert int(ATOMIC) == 7 and ATOMIC.short_name == "two_shot_ll128_atomic"
  assert algorithms.MAX_BYTES[ATOMIC] == algorithms.MAX_BYTES[Algorithm.TWO_SHOT_LL128]
  assert algorithms.DTYPES[ATOMIC] == algorithms.SUPPORTED_DTYPES
  assert all(algorithms.dtype_refusal(ATOMIC, d) is None for d in algorithms.SUPPORTED_DTYPES)
  mib = 1 << 20
  for world in range(2, 17):
    # args.h: TwoShotLL128MaxSteps steps; accumulator slots (2 halves x 4096
    # slots x 256 B = 2 MiB per step), all-gather slots (2 x world x 4096 x
    # 128 B = world MiB per step).
    lines = -(-algorithms.MAX_BYTES[ATOMIC] // 120)
    steps = -(-(-(-lines // world)) // 4096)
    assert algorithms.region_bytes(ATOMIC, world) == steps * (2 * mib + world * mib)
    assert algorithms.region_bytes(ATOMIC, world) < 1 << 31
  assert [algorithms.region_bytes(ATOMIC, w) // mib for w in (2, 3, 4, 8, 16)] == [
      20, 15, 18, 20, 18]


# --- never in a tuning table, forced only ---------------------------------------------------


def test_no_tuning_table_may_choose_it():
  with pytest.raises(ValueError, match="not deterministic"):
    policy.TuningTable("sm_90", 2, (policy.TableRow(4096, ATOMIC),))
  with pytest.raises(tuning.TuningTableError, match="not deterministic"):
    tuning.from_dict({"format": tuning.FORMAT, "architecture": "sm_90", "ranks": 2,
                      "rows": [{"max_bytes": 4096, "algorithm": "two_shot_ll128_atomic"}],
                      "provenance": dict(PROVENANCE, command="test")}, "t.json")


def test_the_builder_leaves_its_rows_out(tmp_path):
  """Faster than everything, and its rows not bitwise correct: the table is
  built from the others, and its note names what was left out."""
  rows = []
  for size in (64, 4096):
    for dt in ("float32", "bfloat16"):
      rows += [_row("lax.psum", size, 20, dt), _row("llar.one_shot_ll", size, 10, dt),
               _row("llar.two_shot_ll128_atomic", size, 1, dt, correct=False,
                    algorithm="two_shot_ll128_atomic")]
  (t,) = tune_tables.build_tables([_results(tmp_path, rows)], command="test")
  assert t["rows"] == [{"max_bytes": 4096, "algorithm": "one_shot_ll"}]
  assert "two_shot_ll128_atomic" not in t["provenance"]["measured"]["implementations"]
  assert "Rows of two_shot_ll128_atomic were left out: not deterministic" in (
      t["provenance"]["note"])
  # Only its rows: nothing to build.
  only = [r for r in rows if r["impl"] != "llar.one_shot_ll" and r["impl"] != "lax.psum"]
  with pytest.raises(tune_tables.TuningBuildError, match="no lax.psum or jax_llar rows"):
    tune_tables.build_tables([_results(tmp_path, only, "only.json")], command="test")


def test_tune_neither_measures_nor_accepts_it(tmp_path):
  """--algorithms refuses it, and the names it accepts (its default) are
  every other algorithm. (In a child: the tool defines absl flags that other
  tools' modules, imported by other tests, define too.)"""
  p = subprocess.run([sys.executable, "-m", "jax_llar.tools.tune",
                      "--algorithms=two_shot_ll128_atomic", "--from_results=x.json",
                      f"--out={tmp_path}"], cwd=ROOT, env=user_env(), capture_output=True,
                     text=True, timeout=120)
  out = p.stdout + p.stderr
  assert p.returncode != 0 and not (tmp_path / "sm_90-2ranks.json").exists()
  assert "not a non-deterministic one: two_shot_ll128_atomic" in out, out[-2000:]
  accepted = out.split("--algorithms must name ", 1)[1].split(" (not", 1)[0].split(", ")
  assert set(accepted) == {a.short_name for a in Algorithm} - {"two_shot_ll128_atomic"}


def test_forcing_it_is_the_way_to_run_it(monkeypatch):
  monkeypatch.setattr(config.settings, "algorithm", "two_shot_ll128_atomic")
  assert config.settings.forced() is ATOMIC
  for dtype in algorithms.SUPPORTED_DTYPES:
    c = policy.choose(dtype, 4 << 20, 4, max_bytes=config.MAX_BYTES_CAP, force=ATOMIC)
    assert (c.algorithm, c.reason) == (ATOMIC, "fast_path"), c
  c = policy.choose(np.float32, (4 << 20) + 4, 4, max_bytes=config.MAX_BYTES_CAP,
                    force=ATOMIC)
  assert (c.algorithm, c.reason) == (None, "size")
  # Without forcing, no table and the default rule never pick it.
  shipped = tuning.from_dict(json.loads((tuning.SHIPPED_DIR / "sm_90-2ranks.json")
                                        .read_text()), "shipped")
  for n in (4, 1 << 10, 1 << 18, 1 << 20, 4 << 20):
    for table in (shipped, None):
      assert policy.choose(np.float32, n, 2, max_bytes=config.MAX_BYTES_CAP,
                           table=table).algorithm is not ATOMIC
