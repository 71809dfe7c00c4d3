"""The one-shot sentinel all-reduce's host side on CPU: its limits and
region against the C++ source, the dtype refusal (policy and settings), the
sentinel's canonical replacement, and the loopback harness's parts that the
one-GPU tests rely on (NaN patterns, the bitwise comparison with another
algorithm, the fault verdict for the sentinel's report). The kernel itself
runs in tests/gpu1/test_sentinel_loopback.py (one GPU) and
tests/gpu/test_sentinel.py (two GPUs)."""

from __future__ import annotations

import dataclasses
import pathlib
import re

import ml_dtypes
import numpy as np
import pytest

from jax_llar import algorithms, config, policy
from jax_llar.algorithms import Algorithm
from jax_llar.tools.loopback import harness as lh

from test_layout import _constexpr_expressions, _evaluate
from test_tools_loopback import FakeNative

ROOT = pathlib.Path(__file__).resolve().parents[1]
SENTINEL = Algorithm.ONE_SHOT_SENTINEL
BF16 = np.dtype(ml_dtypes.bfloat16)
F16, F32, I32 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.int32)
FLOATS = (F32, BF16, F16)
UINT = {2: np.uint16, 4: np.uint32}
KiB = 1024


def _quiet_bits_in_header() -> dict[str, int]:
  """QuietBit<T>::kBit of ffi/include/llar/sentinel.cuh, by T."""
  text = (ROOT / "ffi/include/llar/sentinel.cuh").read_text()
  found = re.findall(r"struct QuietBit<(\w+)>\s*\{\s*static constexpr uint64_t kBit = "
                     r"uint64_t\(1\) << (\d+);", text)
  return {t: 1 << int(b) for t, b in found}


# --- limits, region and ids ---------------------------------------------------------


def test_limits_equal_the_cpp_source():
  exprs = _constexpr_expressions()
  assert _evaluate("kOneShotSentinelMaxBytes", exprs) == algorithms.MAX_BYTES[SENTINEL]
  assert algorithms.MAX_BYTES[SENTINEL] == 512 * KiB == 2 * algorithms.MAX_BYTES[
      Algorithm.ONE_SHOT_LL]
  assert _evaluate("kSentinelFill", exprs) == 0xFF
  assert int(SENTINEL) == 3 and SENTINEL.short_name == "one_shot_sentinel"
  assert SENTINEL in algorithms.MAX_BYTES and algorithms.LARGEST_MAX_BYTES >= 512 * KiB


@pytest.mark.parametrize("world", range(2, algorithms.MAX_RANKS + 1))
def test_region_is_the_one_shot_layout_and_holds_every_slot(world):
  region = algorithms.region_bytes(SENTINEL, world)
  assert region == algorithms.region_bytes(Algorithm.ONE_SHOT_LL, world) == world * 1024 * KiB
  # The last slot (half 1, block 63, source world - 1, thread 511) of
  # ScratchOffset, 16 bytes, ends at the region's end; offsets fit 32 bits.
  last = (((1 * 64 + 63) * world + world - 1) * 512 + 511) * 16
  assert last + 16 == region < 1 << 31
  # The largest payload needs 64 blocks x 512 threads of 16-byte lines: every
  # thread index a slot has.
  assert algorithms.MAX_BYTES[SENTINEL] // 16 == 64 * 512


# --- the dtype refusal -------------------------------------------------------------


def test_dtypes_and_refusal():
  assert algorithms.DTYPES[SENTINEL] == FLOATS
  for a in Algorithm:
    if a is not SENTINEL:
      assert algorithms.DTYPES[a] == algorithms.SUPPORTED_DTYPES
      assert algorithms.dtype_refusal(a, I32) is None
  for d in FLOATS:
    assert algorithms.dtype_refusal(SENTINEL, d) is None
  reason = algorithms.dtype_refusal(SENTINEL, np.int32)
  assert "float32, bfloat16 and float16 only" in reason and "int32" in reason


def test_forced_sentinel_refuses_int32_and_serves_floats_up_to_its_limit():
  limit = algorithms.MAX_BYTES[SENTINEL]
  cap = config.MAX_BYTES_CAP
  c = policy.choose(np.int32, 1024, 2, max_bytes=cap, force=SENTINEL)
  assert c.algorithm is None and c.reason == "dtype" and "forced" in c.detail
  for d in FLOATS:
    for n in (d.itemsize, 1024, limit):
      c = policy.choose(d, n, 4, max_bytes=cap, force=SENTINEL)
      assert c.algorithm is SENTINEL and c.reason == "fast_path", (d, n, c)
    c = policy.choose(d, limit + d.itemsize, 4, max_bytes=cap, force=SENTINEL)
    assert c.algorithm is None and c.reason == "size"
  # int32 with no algorithm forced still takes the default rule.
  assert policy.choose(np.int32, 1024, 2, max_bytes=cap).algorithm is not None


def test_a_table_row_naming_the_sentinel_leaves_int32_to_the_default_algorithm():
  table = policy.TuningTable("sm_90", 2, (policy.TableRow(4096, SENTINEL),))
  c = policy.choose(np.int32, 1024, 2, max_bytes=config.MAX_BYTES_CAP, table=table)
  assert c.algorithm is policy.DEFAULT_ALGORITHM and c.reason == "fast_path"
  assert "int32" in c.detail and "default rule" in c.detail
  c = policy.choose(np.float16, 1024, 2, max_bytes=config.MAX_BYTES_CAP, table=table)
  assert c.algorithm is SENTINEL


def test_setting_accepts_the_sentinel(monkeypatch):
  monkeypatch.setattr(config.settings, "algorithm", "one_shot_sentinel")
  assert config.settings.forced() is SENTINEL
  with pytest.raises(ValueError, match="one_shot_sentinel"):
    config.settings.algorithm = "one_shot_sentinels"


# --- the sentinel and its replacement ------------------------------------------------


def test_quiet_bits_equal_the_header_and_the_replacement_is_a_quietable_nan():
  header = _quiet_bits_in_header()
  assert header == {"float": lh.QUIET_BIT[F32], "__nv_bfloat16": lh.QUIET_BIT[BF16],
                    "__half": lh.QUIET_BIT[F16]}
  for d in FLOATS:
    u = UINT[d.itemsize]
    ones = np.iinfo(u).max
    replacement = np.array([ones ^ lh.QUIET_BIT[d]], u)
    with np.errstate(invalid="ignore"):
      value = replacement.view(d).astype(np.float64)
    assert np.isnan(value).all(), d
    # Setting the quiet bit (what quieting a signalling NaN does) gives back
    # the all-ones element; the quiet bit is the top mantissa bit.
    assert int(replacement[0]) | lh.QUIET_BIT[d] == ones
    exponent = lh._EXPONENT[d]
    assert lh.QUIET_BIT[d] << 1 == (exponent & -exponent)
  # As 8-byte words (element 0 lowest): f32 0xffffffff_ffbfffff,
  # bf16 0xffff_ffff_ffff_ffbf, f16 0xffff_ffff_ffff_fdff.
  assert [np.uint64(0xFFFFFFFFFFFFFFFF ^ lh.QUIET_BIT[d]) for d in FLOATS] == [
      np.uint64(0xFFFFFFFFFFBFFFFF), np.uint64(0xFFFFFFFFFFFFFFBF),
      np.uint64(0xFFFFFFFFFFFFFDFF)]


# --- NaN patterns for the bitwise comparison -----------------------------------------


@pytest.mark.parametrize("dtype, count", [(F16, 2 * 1023), (BF16, 2 * 127)], ids=str)
def test_every_16_bit_nan_pattern(dtype, count):
  p = lh.nan_bit_patterns(dtype, np.random.default_rng(0))
  assert len(p) == len(np.unique(p)) == count
  with np.errstate(invalid="ignore"):
    values = p.view(dtype).astype(np.float64)
  assert np.isnan(values).all()
  # ... and nothing else is a NaN.
  every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
  with np.errstate(invalid="ignore"):
    assert np.isnan(every.view(dtype).astype(np.float64)).sum() == count


def test_float32_nan_sample_holds_the_named_patterns():
  p = lh.nan_bit_patterns(F32, np.random.default_rng(0), f32_sample=500)
  assert set(lh.F32_NANS) <= set(int(v) for v in p)
  assert np.isnan(p.view(np.float32)).all() and len(p) > 500


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("world", [2, 3, 16])
def test_nan_pattern_lines_cover_every_pattern_in_every_position(dtype, world):
  rng = np.random.default_rng(world)
  patterns = set(int(v) for v in lh.nan_bit_patterns(dtype, np.random.default_rng(world)))
  lines = lh.nan_pattern_lines(rng, world, dtype)
  per_line = 16 // dtype.itemsize
  assert lines.shape[1:] == (world, per_line)
  k = len(patterns)
  every, alone = lines[:k], lines[k:2 * k]
  with np.errstate(invalid="ignore"):
    nan = np.isnan(lines.view(dtype).astype(np.float64))
  for q in range(per_line):
    for r in range(world):
      assert set(int(v) for v in every[:, r, q]) == patterns, (q, r)
    # Block 2: each pattern once per position, at rank j % world, alone.
    assert set(int(v) for v in alone[np.arange(k), np.arange(k) % world, q]) == patterns
  assert (nan[k:2 * k].sum(axis=1) == 1).all()
  # Block 3: all-ones words at every rank and word position, and the
  # replacement word beside them.
  u = UINT[dtype.itemsize]
  ones = np.iinfo(u).max
  words = lines[2 * k:].reshape(-1, world, 2, per_line // 2)
  all_ones = (words == ones).all(axis=3)
  for r in range(world):
    for w in range(2):
      assert all_ones[:, r, w].any(), (r, w)
  replacement = (words[..., 0] == (ones ^ lh.QUIET_BIT[dtype])) & (words[..., 1:] == ones).all(3)
  assert replacement.any() and (all_ones.sum(axis=1) == world).any()


def test_nan_pattern_set_fits_in_64_kib_and_make_inputs_puts_it_in_set_two():
  rng = np.random.default_rng(3)
  for dtype in FLOATS:
    case = lh.Case(4, str(dtype), 64 * KiB + 4 * KiB)
    x = lh.make_inputs(rng, case, 4, specials=True, nan_patterns=True)
    lines = lh.nan_pattern_lines(np.random.default_rng(0), 4, dtype)
    assert lines.size * dtype.itemsize <= 4 * (64 * KiB + 4 * KiB), dtype
    with np.errstate(invalid="ignore"):
      nan = np.isnan(x.astype(np.float64))
    assert nan[2].sum() > nan[1].sum() > 0 and not nan[0].any() and not nan[3].any()
  # int32 has none.
  x = lh.make_inputs(rng, lh.Case(2, "int32", 4096), 3, specials=False, nan_patterns=True)
  assert x.dtype == I32


# --- the harness's settings and cases for the sentinel ------------------------------


def test_harness_settings_for_the_sentinel():
  s = lh.Settings(algorithm="one_shot_sentinel", sizes=(4, 524288), misalign=15,
                  generic=True, block_lines=32, nan_patterns=True,
                  bitwise_against="one_shot_ll")
  assert lh.validate(s) == []
  bad = {"misalign": 16, "nan_patterns": True, "bitwise_against": "one_shot_sentinel",
         "bitwise_nan": "payload"}
  for k, v in bad.items():
    change = {k: v} | ({"sets": 2} if k == "nan_patterns" else {})
    assert len(lh.validate(dataclasses.replace(s, **change))) == 1, k
  assert lh.validate(dataclasses.replace(s, sizes=(524289,)))
  assert lh.validate(dataclasses.replace(s, algorithm="two_shot_ll", sizes=(4,)))


def test_cases_skip_int32_and_what_the_comparison_cannot_run():
  s = lh.Settings(algorithm="one_shot_sentinel", worlds=(2,),
                  dtypes=("float32", "int32"), sizes=(4096, 524288),
                  bitwise_against="one_shot_ll")
  got = {(c.dtype, c.n_bytes): reason for c, reason in lh.cases(s)}
  assert got[("float32", 4096)] is None
  assert "float32, bfloat16 and float16 only" in got[("int32", 4096)]
  assert "exceeds one_shot_ll's 262144" in got[("float32", 524288)]
  s = dataclasses.replace(s, bitwise_against=None)
  assert [r is None for _, r in lh.cases(s)] == [True, True, False, False]


# --- the bitwise comparison ---------------------------------------------------------


def test_bitwise_difference_sees_nan_bits_that_the_reference_check_allows():
  rng = np.random.default_rng(5)
  out = rng.standard_normal((2, 3, 8)).astype(np.float16)
  out[0, 1, 2] = np.nan
  other = out.copy()
  assert lh.bitwise_difference(out, other, 0) is None
  other.view(np.uint16)[0, 1, 2] ^= 1  # another NaN: the reference check accepts it
  assert not lh.mismatch_mask(out, other).any()
  d = lh.bitwise_difference(out, other, 4, inputs=np.zeros((3, 3, 8), np.float16))
  assert (d["call"], d["rank"], d["index"], d["elements"]) == (4, 1, 2, 1)
  assert len(d["inputs"]) == 3
  assert lh.bitwise_difference(out, other, 4, nan="position") is None
  assert lh.nan_payload_differences(out, other) == 1
  other[1, 0, 0] = -0.0 if out[1, 0, 0] != -0.0 else 0.0  # a signed zero is a difference
  d = lh.bitwise_difference(out, other, 0, nan="position")
  assert (d["call"], d["rank"], d["index"], d["elements"]) == (1, 0, 0, 1)
  assert lh.nan_bits(out) == ["0x7e00"]
  assert lh.nan_bits(np.ones(4, np.int32)) == []


def test_non_canonical_nans_counts_every_other_nan():
  for dtype in FLOATS:
    u = UINT[dtype.itemsize]
    canonical = lh.CANONICAL_NAN[dtype]
    bits = np.array([canonical, canonical ^ 1, canonical | (1 << (8 * dtype.itemsize - 1)),
                     0, int(np.array([1.0], dtype).view(u)[0])], u)
    assert lh.non_canonical_nans(bits.view(dtype)) == 2, dtype
  assert lh.non_canonical_nans(np.array([-1, 7], np.int32)) == 0
  # The header's constants (reduce.cuh: every algorithm's NaN results).
  text = (ROOT / "ffi/include/llar/reduce.cuh").read_text()
  assert "kCanonicalNaN32 = 0x7FFFFFFFu" in text and "kCanonicalNaN16 = 0x7FFFu" in text
  assert lh.CANONICAL_NAN == {F32: 0x7FFFFFFF, BF16: 0x7FFF, F16: 0x7FFF}


class OneNanBitOff(FakeNative):
  """FakeNative whose outputs of one algorithm carry another NaN at one
  element (every rank alike) where the reference has a NaN."""

  def __init__(self, algorithm):
    super().__init__()
    self.flip_for = algorithm

  def loopback(self, raw, dtype, calls, **kw):
    r = super().loopback(raw, dtype, calls, **kw)
    if kw.get("algorithm") == self.flip_for:
      out = np.array(r["outputs"])
      np_dtype = lh.DTYPES[{v: k for k, v in FakeNative.DTYPE_CODES.items()}[dtype]]
      vals = out.view(np_dtype)
      where = np.argwhere(np.isnan(vals.astype(np.float64)))
      k, _, i = where[0]
      vals.view(UINT[np_dtype.itemsize])[k, :, i] ^= 1  # at every rank alike
      r["outputs"] = out
    return r


@pytest.fixture
def fake_run(monkeypatch):
  monkeypatch.setattr(lh.report, "environment", lambda: {"stub": True})

  def run(fake, settings):
    monkeypatch.setattr(lh._native, "require", lambda what: fake)
    return lh.run(settings)

  return run


# The stand-in's reference sums keep numpy's NaN bits (not canonical): only
# the comparison of the two algorithms is under test here.
SENT = lh.Settings(algorithm="one_shot_sentinel", worlds=(2, 3), dtypes=("float16",),
                   sizes=(4096,), calls=4, nan_patterns=True, bitwise_against="one_shot_ll",
                   canonical_nan=False)


def test_run_with_bitwise_comparison_passes_when_equal(fake_run):
  fake = FakeNative()
  rows = fake_run(fake, SENT)["rows"]
  assert lh.summary(rows) == {"pass": 2}
  assert all(r["bitwise_equal"] and r["ranks_bitwise_equal"] for r in rows)
  assert all(r["nan_bits"] for r in rows)  # the NaN patterns reached the outputs
  assert [c["algorithm"] for c in fake.calls] == [3, 1, 3, 1]


class OtherLosesContext(FakeNative):
  """FakeNative whose run of one algorithm (the bitwise_against one) loses
  the CUDA context."""

  def __init__(self, algorithm):
    super().__init__()
    self.lose_for = algorithm

  def loopback(self, raw, dtype, calls, **kw):
    if kw.get("algorithm") == self.lose_for:
      self.cuda_error = "cudaErrorIllegalAddress"
    try:
      r = super().loopback(raw, dtype, calls, **kw)
    finally:
      self.cuda_error = None
    if kw.get("algorithm") == self.lose_for:
      r["records"][0]["code"] = 3  # the trapping rank's record
    return r


def test_a_lost_context_in_the_bitwise_run_stops_the_cases(fake_run, capsys):
  """The second algorithm's run losing the context makes the case a CUDA
  error, named as the bitwise_against run's, and no later case runs on the
  dead context (it was a bitwise_error alone, and the next case ran)."""
  fake = OtherLosesContext(int(Algorithm.ONE_SHOT_LL))
  rows = fake_run(fake, SENT)["rows"]
  assert [r["status"] for r in rows] == ["error", "not_run"], rows
  assert rows[0]["cuda_error"].startswith("one_shot_ll (bitwise_against)")
  assert rows[0]["bitwise_error"] == "cudaErrorIllegalAddress"
  assert [r["code"] for r in rows[0]["bitwise_records"]] == [3]
  assert "context was lost" in rows[1]["reason"]
  assert [c["algorithm"] for c in fake.calls] == [int(SENTINEL), int(Algorithm.ONE_SHOT_LL)]
  assert "stopped:" in capsys.readouterr().out


def test_run_with_bitwise_comparison_fails_on_one_nan_bit(fake_run, capsys):
  rows = fake_run(OneNanBitOff(int(SENTINEL)), SENT)["rows"]
  assert lh.summary(rows) == {"fail": 2}
  assert all("first_mismatch" not in r for r in rows)  # NaN by position agrees
  assert all(r["bitwise_difference"]["elements"] == r["world_size"] for r in rows)
  assert all(r["nan_payload_differences"] == r["world_size"] for r in rows)
  assert "differs from one_shot_ll" in capsys.readouterr().out
  # By position, the NaN bits are only counted.
  rows = fake_run(OneNanBitOff(int(SENTINEL)),
                  dataclasses.replace(SENT, bitwise_nan="position"))["rows"]
  assert lh.summary(rows) == {"pass": 2}
  assert all(r["nan_payload_differences"] == r["world_size"] and r["bitwise_equal"]
             for r in rows)


def test_run_with_canonical_nan_fails_on_other_nans(fake_run):
  # numpy's NaN (float16 0x7e00) is not the canonical NaN 0x7fff.
  rows = fake_run(FakeNative(), dataclasses.replace(SENT, canonical_nan=True))["rows"]
  assert lh.summary(rows) == {"fail": 2}
  assert all(r["non_canonical_nans"] > 0 for r in rows)


# --- the fault verdict for the sentinel's report --------------------------------------


def _sentinel_fault(seen=(0xFFFFFFFF, 0xFFFFFFFF)):
  spec = lh.fault_spec(lh.Settings(calls=8, timeout_ms=1000, algorithm="one_shot_sentinel"),
                       lh.Case(4, "float32", 4096, 10), skip_rank=1, skip_call=5)
  epoch = 15
  records = []
  for i in range(4):
    r = dict(code=0, rank=0, peer=0, block=0, line=0, flag_expected=0, flag_seen=0,
             flag_seen2=0, epoch=0, waited_ns=0)
    if i in (0, 2):
      r.update(code=1, rank=i, peer=1, line=3, flag_expected=0xFFFFFFFF, flag_seen=seen[0],
               flag_seen2=seen[1], epoch=epoch, waited_ns=1_000_500_000)
    records.append(r)
  data = {"calls_launched": 6, "failed_call": 5, "cuda_error": "cudaErrorLaunchFailure",
          "deadline_exceeded": False, "seconds_to_error": 1.2, "records": records}
  return spec, data


def test_fault_verdict_for_the_sentinel_report():
  spec, data = _sentinel_fault()
  assert lh.fault_problems(spec, data) == []
  spec, data = _sentinel_fault(seen=(0xFFFFFFFF, 0x12345678))  # word 1 arrived
  assert any("flag fields" in p for p in lh.fault_problems(spec, data))
  # The LL's flag is not the sentinel's.
  spec, data = _sentinel_fault()
  data["records"][0]["flag_expected"] = (15 & 0xFFFFFFFF) | 1
  assert any("flag fields" in p for p in lh.fault_problems(spec, data))
