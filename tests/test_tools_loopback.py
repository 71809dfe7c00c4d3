"""The loopback harness's Python side on CPU (jax_llar.tools.loopback.harness
and the command line jax_llar.tools.loopback): settings, cases, the special
inputs, the bitwise check, a run against a numpy stand-in of the native
harness, the fault verdict and the bounded fault child. The harness itself
needs a GPU (tests/gpu1/)."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import textwrap
import time

import ml_dtypes
import numpy as np
import pytest

from jax_llar import testing
from jax_llar.tools.loopback import harness as lh

ROOT = pathlib.Path(__file__).resolve().parent.parent
BF16 = np.dtype(ml_dtypes.bfloat16)
CODES = {"float32": 0, "bfloat16": 1, "float16": 2, "int32": 3}  # DTYPE_CODES
UINT = {2: np.uint16, 4: np.uint32}


# --- settings and cases -----------------------------------------------------------


def test_default_settings_are_valid_and_cover_the_brief():
  s = lh.Settings()
  assert lh.validate(s) == []
  assert s.worlds == (2, 3, 4, 5, 8, 16) and s.calls == 50 and s.sync
  assert {"float32", "bfloat16", "float16"} <= set(s.dtypes)
  assert max(s.sizes) == lh.MAX_BYTES == 262144 and lh.MAX_RANKS == 16


@pytest.mark.parametrize("change, words", [
    (dict(worlds=(1, 2)), "world sizes"), (dict(worlds=(17,)), "world sizes"),
    (dict(worlds=()), "world sizes"), (dict(dtypes=("float64",)), "dtypes"),
    (dict(sizes=(0,)), "sizes"), (dict(sizes=(262152,)), "sizes"),
    (dict(calls=0), "calls"), (dict(sets=0), "sets"), (dict(block_lines=513), "block_lines"),
    (dict(timeout_ms=0), "timeout_ms"), (dict(start_epochs=(-1,)), "start epochs"),
    (dict(start_epochs=(2**64 - 1,)), "start epochs"), (dict(misalign=16), "misalign"),
    (dict(keep=51), "keep"), (dict(max_output_bytes=0), "max_output_bytes"),
])
def test_validate_names_each_bad_setting(change, words):
  errors = lh.validate(dataclasses.replace(lh.Settings(), **change))
  assert len(errors) == 1 and words in errors[0], errors


def test_cases_order_and_skips():
  s = lh.Settings(worlds=(2, 16), dtypes=("float32", "bf16"), sizes=(6, 8),
                  start_epochs=(0, 7))
  got = lh.cases(s)
  assert len(got) == 2 * 2 * 2 * 2
  assert got[0][0] == lh.Case(2, "float32", 6, 0) and got[1][0] == lh.Case(2, "float32", 6, 7)
  skipped = [(c.dtype, c.n_bytes) for c, why in got if why]
  assert set(skipped) == {("float32", 6)}  # 6 bytes: 3 bf16 elements, 1.5 float32
  assert "whole number of float32 elements" in got[0][1]
  assert lh.Case(3, "bf16", 6).n_elems == 3 and lh.Case(3, "bf16", 6).np_dtype == BF16


def test_kept_calls_is_bounded_by_memory():
  s = lh.Settings(calls=50, max_output_bytes=16 * 262144 * 10)
  assert lh.kept_calls(s, lh.Case(16, "float32", 262144)) == 10
  assert lh.kept_calls(s, lh.Case(2, "float32", 4)) == 50
  assert lh.kept_calls(dataclasses.replace(s, keep=5), lh.Case(2, "float32", 4)) == 5
  assert lh.kept_calls(dataclasses.replace(s, max_output_bytes=1), lh.Case(2, "f32", 4)) == 1


# --- inputs ------------------------------------------------------------------------


def _bits(x):
  x = np.asarray(x)
  return x.view(UINT[x.dtype.itemsize])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("world", [2, 3, 5, 16])
def test_special_columns_sum_as_intended(dtype, world):
  cols = lh.special_columns(world, lh.DTYPES[dtype])
  assert cols.shape == (17, world) and cols.dtype == lh.DTYPES[dtype]
  want = testing.rank_order_sum(list(cols.T), cols.dtype)
  f64 = want.astype(np.float64)
  assert f64[0] == 0 and np.signbit(f64[0])  # -0.0 + -0.0 stays -0.0
  assert f64[1] == 0 and not np.signbit(f64[1]) and not np.signbit(f64[2])
  tiny = float(ml_dtypes.finfo(cols.dtype).smallest_subnormal)
  assert f64[3] == world * tiny  # subnormals kept, not flushed
  assert f64[5] >= float(ml_dtypes.finfo(cols.dtype).smallest_normal)
  assert np.isposinf(f64[6]) and np.isnan(f64[7]) and np.isnan(f64[8])
  assert np.isposinf(f64[9])  # the sum of maxima overflows
  if world > 2:
    assert f64[11] == world - 2  # only a float64 sum keeps the small terms
  assert f64[12] == 1.0  # a tie rounds to even
  assert np.isnan(f64[14:]).all()
  raw = _bits(cols[14:])
  with np.errstate(invalid="ignore"):  # a signalling NaN
    nans = np.isnan(cols[14:].astype(np.float64))
  assert nans.sum() == 3 and len({int(v) for v in raw[nans]}) == 3


def test_special_columns_int32_wrap():
  cols = lh.special_columns(4, np.int32)
  want = testing.rank_order_sum(list(cols.T), np.int32)
  i = np.iinfo(np.int32)
  assert want[0] == np.int32(4 * i.max - 2**32 * 2) and want[2] == -4


def test_make_inputs_puts_specials_in_set_one():
  rng = np.random.default_rng(0)
  case = lh.Case(3, "float16", 4096)
  x = lh.make_inputs(rng, case, 4, specials=True)
  assert x.shape == (4, 3, 2048) and x.dtype == np.float16
  finite = np.isfinite(x.astype(np.float64))
  assert finite[[0, 2, 3]].all() and not finite[1].all()
  cols = lh.special_columns(3, np.float16)
  assert testing.bitwise_equal(x[1][:, :len(cols)], cols.T)
  one = lh.make_inputs(rng, lh.Case(2, "float32", 4), 1, specials=True)
  assert one.shape == (1, 2, 1)
  assert testing.bitwise_equal(one[0][:, 0], lh.special_columns(2, np.float32)[0])


# --- the check ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, BF16, np.float16, np.int32])
def test_mismatch_mask_agrees_with_bitwise_equal(dtype):
  rng = np.random.default_rng(3)
  base = testing.random_array(rng, (64,), dtype)
  for trial in range(200):
    a, b = base.copy(), base.copy()
    if np.dtype(dtype).kind == "f" or np.dtype(dtype) == BF16:
      u = UINT[np.dtype(dtype).itemsize]
      nan = 0x7FC00000 if np.dtype(dtype).itemsize == 4 else (
          0x7FC0 if np.dtype(dtype) == BF16 else 0x7E00)
      for arr in (a, b):
        k = rng.integers(0, 64, size=rng.integers(0, 3))
        arr.view(u)[k] = nan | rng.integers(0, 4, size=len(k))  # NaNs, payloads differ
    if trial % 3 == 0:
      b.view(UINT.get(b.dtype.itemsize, np.uint32))[rng.integers(0, 64)] ^= 1
    mask = lh.mismatch_mask(a, b)
    assert (not mask.any()) == testing.bitwise_equal(a, b), trial
    for i in range(64):
      assert mask[i] == (not testing.bitwise_equal(a[i:i + 1], b[i:i + 1]))


def test_signed_zero_is_a_mismatch_and_nan_payload_is_not():
  got = np.array([0.0, np.nan, 1.0], np.float32)
  want = np.array([-0.0, np.nan, 1.0], np.float32)
  want.view(np.uint32)[1] = 0xFFC00001
  assert lh.mismatch_mask(got, want).tolist() == [True, False, False]
  with pytest.raises(ValueError):
    lh.mismatch_mask(got, want.astype(np.float16))


def _outputs(refs, calls, world, first=0):
  sets = refs.shape[0]
  return np.stack([np.stack([refs[(first + k) % sets]] * world) for k in range(calls)])


def test_first_mismatch_finds_the_first_wrong_element():
  rng = np.random.default_rng(1)
  case = lh.Case(4, "bfloat16", 200)
  x = lh.make_inputs(rng, case, 3, specials=True)
  refs = lh.references(x)
  assert refs.shape == (3, 100) and refs.dtype == BF16
  out = _outputs(refs, 7, 4, first=5)
  assert lh.first_mismatch(out, refs, 5, x) is None
  bad = out.copy()
  bad[4, 2, 9] = np.asarray(-1.5, BF16)  # call 9, rank 2
  bad[6, 0, 1] = np.asarray(7.0, BF16)   # a later call
  m = lh.first_mismatch(bad, refs, 5, x)
  assert (m["call"], m["rank"], m["index"]) == (9, 2, 9)
  assert m["got"] == {"bits": "0xbfc0", "value": "-1.5"}
  assert m["want"]["bits"] == f"0x{int(_bits(refs[0, 9])):04x}"
  assert len(m["inputs"]) == 4 and m["wrong_elements"] == 2 and m["wrong_calls"] == 2


# --- a run against a numpy stand-in of the native harness ----------------------------


class FakeNative:
  """The native module's loopback API, computed in numpy: every rank gets the
  reference, unless told to corrupt one element or fail."""
  DTYPE_CODES = CODES

  def __init__(self, corrupt=None, co_resident=True, cuda_error=None, epoch_mismatch=None):
    self.corrupt, self.co_resident = corrupt, co_resident
    self.cuda_error, self.epoch_mismatch = cuda_error, epoch_mismatch
    self.calls = []

  def loopback_plan(self, world, n_bytes, dtype, calls=1, keep=0, n_sets=1, algorithm=1,
                    generic=False, block_lines=0, ordinal=0):
    return {"blocks": 1, "lines_per_block": 1, "threads": 32, "regs_per_thread": 40,
            "blocks_per_sm": 32, "sms": 132, "co_resident": self.co_resident,
            "generic_kernel": generic or world not in (2, 4, 8), "device_bytes": 0}

  def loopback(self, raw, dtype, calls, *, sync=True, keep=0, algorithm=1, generic=False,
               block_lines=0, timeout_ms=2000.0, start_epoch=0, misalign=0, ordinal=0,
               skip_rank=-1, skip_call=0):
    self.calls.append(dict(sync=sync, keep=keep, start_epoch=start_epoch,
                           algorithm=algorithm))
    np_dtype = lh.DTYPES[{v: k for k, v in CODES.items()}[dtype]]
    x = raw.view(np_dtype)
    refs = lh.references(x)
    world = x.shape[1]
    keep = keep or calls
    first = calls - keep
    out = _outputs(refs, keep, world, first).copy()
    if self.corrupt is not None:
      k, r, i = self.corrupt
      out.view(UINT[np_dtype.itemsize])[k, r, i] ^= 1
    records = [dict(code=0, rank=0, peer=0, block=0, line=0, flag_expected=0, flag_seen=0,
                    flag_seen2=0, epoch=0, waited_ns=0) for _ in range(world)]
    return {"outputs": out.view(np.uint8).reshape(keep, world, -1) if not self.cuda_error
            else np.zeros((0, world, raw.shape[2]), np.uint8),
            "first_kept_call": first, "calls_launched": calls, "records": records,
            "cuda_error": self.cuda_error, "failed_call": 0 if self.cuda_error else -1,
            "deadline_exceeded": False, "seconds": 0.01, "seconds_to_error": 0.0,
            "epochs_checked": not self.cuda_error, "epoch_mismatch": self.epoch_mismatch,
            "max_connections": "32", "plan": {}}


@pytest.fixture
def fake_run(monkeypatch):
  monkeypatch.setattr(lh.report, "environment", lambda: {"stub": True})

  def run(fake, settings, **kw):
    monkeypatch.setattr(lh._native, "require", lambda what: fake)
    return lh.run(settings, **kw)

  return run


SMALL = lh.Settings(worlds=(2, 3), dtypes=("float32", "bfloat16", "int32"),
                    sizes=(6, 100), calls=5, keep=3, start_epochs=(0, 5))


def test_run_passes_with_correct_outputs(fake_run, capsys):
  fake = FakeNative()
  result = fake_run(fake, SMALL)
  rows = result["rows"]
  assert result["level"] == "loopback" and "not NVLink" in result["note"]
  assert result["settings"]["skip_rank"] == -1 and result["env"] == {"stub": True}
  assert lh.summary(rows) == {"pass": 16, "skipped": 8}
  assert {r["kernel"] for r in rows if r["status"] == "pass"} == {"world 2", "generic"}
  assert all(r["calls_checked"] == 3 for r in rows if r["status"] == "pass")
  assert {c["start_epoch"] for c in fake.calls} == {0, 5}
  json.dumps(result)  # a record
  assert "PASS" in capsys.readouterr().out


def test_run_reports_the_first_mismatch(fake_run):
  s = dataclasses.replace(SMALL, worlds=(3,), dtypes=("float32",), sizes=(100,),
                          start_epochs=(0,))
  row = fake_run(FakeNative(corrupt=(1, 2, 7)), s)["rows"][0]
  assert row["status"] == "fail" and not row["correct"]
  m = row["first_mismatch"]
  assert (m["call"], m["rank"], m["index"], m["wrong_elements"]) == (3, 2, 7, 1)


def test_run_fails_on_epoch_mismatch_and_skips_what_does_not_fit(fake_run):
  s = dataclasses.replace(SMALL, worlds=(2,), dtypes=("float32",), sizes=(100,),
                          start_epochs=(0,))
  row = fake_run(FakeNative(epoch_mismatch="rank 1 block 0 warp 0: epoch 4"), s)["rows"][0]
  assert row["status"] == "fail" and row["epoch_mismatch"].startswith("rank 1")
  row = fake_run(FakeNative(co_resident=False), s)["rows"][0]
  assert row["status"] == "skipped" and "not co-resident" in row["reason"]


def test_a_cuda_error_stops_the_run(fake_run, capsys):
  result = fake_run(FakeNative(cuda_error="cudaErrorLaunchFailure: unspecified"), SMALL)
  statuses = [r["status"] for r in result["rows"] if r["status"] != "skipped"]
  assert statuses[0] == "error" and set(statuses[1:]) == {"not_run"}
  assert "CUDA context was lost" in result["rows"][-1]["reason"]
  assert "stopped:" in capsys.readouterr().out


# --- fault mode --------------------------------------------------------------------


def _fault_spec(**kw):
  spec = lh.fault_spec(lh.Settings(calls=8, timeout_ms=1000), lh.Case(4, "float32", 4096, 10),
                       skip_rank=1, skip_call=5)
  spec.update(kw)
  return spec


def _fault_data(spec, reporters=(0, 2)):
  epoch = spec["start_epoch"] + spec["skip_call"]
  records = []
  for i in range(spec["world"]):
    r = dict(code=0, rank=0, peer=0, block=0, line=0, flag_expected=0, flag_seen=0,
             flag_seen2=0, epoch=0, waited_ns=0)
    if i in reporters:
      # Call skip_call's signature in the LL flag (ll.cuh): sig << 16 | low16(E) | 1.
      sig = lh.call_signature(0, spec["skip_call"])
      r.update(code=1, rank=i, peer=spec["skip_rank"], block=0, line=3,
               flag_expected=(sig << 16) | (epoch & 0xFFFF) | 1, epoch=epoch,
               waited_ns=1_000_500_000, signature_expected=sig, flag_epoch_bits=16)
    records.append(r)
  return {"calls_launched": spec["skip_call"] + 1, "failed_call": spec["skip_call"],
          "cuda_error": "cudaErrorLaunchFailure: unspecified launch failure",
          "deadline_exceeded": False, "seconds_to_error": 1.2, "records": records}


def test_fault_verdict_accepts_the_expected_report():
  spec = _fault_spec()
  assert spec["skip_rank"] == 1 and spec["start_epoch"] == 10 and spec["world"] == 4
  assert lh.fault_problems(spec, _fault_data(spec)) == []
  assert lh.fault_problems(spec, {"skipped": "not co-resident"}) == []
  assert "cannot run the harness: no GPU" in lh.fault_problems(spec, {"unavailable": "no GPU"})[0]


@pytest.mark.parametrize("change, words", [
    (lambda d: d.update(cuda_error=None), "no CUDA error"),
    (lambda d: d.update(deadline_exceeded=True), "hang"),
    (lambda d: d.update(failed_call=4), "call 4"),
    (lambda d: d["records"][0].update(peer=3), "peer 3"),
    (lambda d: d["records"][2].update(rank=0), "names rank 0"),
    (lambda d: d["records"][0].update(epoch=14), "epoch 14"),
    (lambda d: d["records"][0].update(flag_expected=3), "expected flag"),
    (lambda d: d["records"][0].update(signature_expected=0), "expected signature"),
    (lambda d: d["records"][0].update(waited_ns=5), "less than the timeout"),
    (lambda d: d["records"][1].update(code=1, rank=1, peer=1), "skipped rank reported"),
    (lambda d: [r.update(code=0) for r in d["records"]], "no rank reported"),
    (lambda d: d.update(seconds_to_error=30.0), "more than the timeout"),
])
def test_fault_verdict_names_each_problem(change, words):
  spec = _fault_spec()
  data = _fault_data(spec)
  change(data)
  problems = lh.fault_problems(spec, data)
  assert any(words in p for p in problems), problems
  assert lh.fault_problems(spec, None) == ["the child printed no result"]


def test_fault_child_is_bounded_and_read(tmp_path, monkeypatch):
  (tmp_path / "hang_child.py").write_text("import time\ntime.sleep(60)\n")
  (tmp_path / "ok_child.py").write_text(textwrap.dedent("""\
      import json, sys
      spec = json.loads(sys.argv[1])
      print("noise")
      print(json.dumps({"world": spec["world"], "connections": __import__("os").environ[
          "CUDA_DEVICE_MAX_CONNECTIONS"]}))
      """))
  env = dict(os.environ, PYTHONPATH=str(tmp_path))
  env.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
  monkeypatch.setattr(lh, "CHILD_START_S", 1)
  monkeypatch.setattr(lh, "CHILD", "hang_child")
  got = lh.run_fault_child(_fault_spec(timeout_ms=1), env=env)
  assert got["hung"] and got["data"] is None
  monkeypatch.setattr(lh, "CHILD_START_S", 60)
  monkeypatch.setattr(lh, "CHILD", "ok_child")
  got = lh.run_fault_child(_fault_spec(), env=env)
  assert not got["hung"] and got["rc"] == 0
  assert got["data"] == {"world": 4, "connections": lh.MAX_CONNECTIONS}


# --- the command line ----------------------------------------------------------------


def _cli(*args):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, "-m", "jax_llar.tools.loopback", *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=120, env=env)


def test_cli_without_gpu_says_what_it_needs():
  p = _cli("--worlds=2", "--sizes=8", "--dtypes=float32")
  assert p.returncode == 1, p.stderr[-2000:]
  assert "needs one CUDA GPU and the CUDA extension" in p.stdout
  assert "Traceback" not in p.stdout + p.stderr


def test_cli_rejects_bad_arguments_before_any_device():
  p = _cli("--worlds=1,17", "--sizes=0", "--dtypes=float64", "--start_epochs=x")
  assert p.returncode == 1 and "--start_epochs must be integers" in p.stdout, p.stdout
  p = _cli("--worlds=1,17", "--sizes=0,8", "--dtypes=float64")
  assert p.returncode == 1
  for words in ("world sizes must be 2-16", "dtypes must be among", "sizes must be 1-262144"):
    assert words in p.stdout, p.stdout
  p = _cli("--skip_rank=1", "--skip_call=9", "--calls=5")
  assert p.returncode == 1 and "--skip_call must be below --calls" in p.stdout


def test_importing_the_tools_loads_no_native_module():
  code = ("import sys; import jax_llar.tools.loopback.harness, jax_llar.tools.loopback; "
          "print(sorted(m for m in sys.modules if m.endswith('_llar_tools') or "
          "m == 'jax_llar._llar'))")
  p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                     timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert p.returncode == 0 and p.stdout.strip() == "[]", p.stderr[-2000:]


def test_run_cases_stops_after_a_lost_context_only_in_process(capsys):
  from jax_llar.tools.loopback import harness as harness  # pylint: disable=g-import-not-at-top
  lost = {"status": "fail", "cuda_error": "cudaErrorLaunchFailure"}
  ok = {"status": "pass"}

  def items():
    for i, row in enumerate([lost, ok]):
      yield {"status": "error"}, None, (lambda row=row: dict(row)), f"case {i}"

  rows = harness.run_cases(items(), lambda r: r["status"])
  assert [r["status"] for r in rows] == ["fail", "not_run"]
  assert "case 0" in rows[1]["reason"] and "stopped" in capsys.readouterr().out
  rows = harness.run_cases(items(), lambda r: r["status"], in_process=False)
  assert [r["status"] for r in rows] == ["fail", "pass"]


def test_run_cases_runs_children_at_once_and_keeps_case_order(capsys):
  """jobs > 1 (fault mode): the cases run concurrently (each waits at a
  barrier that only the others' arrival lifts), the rows and the printed
  lines keep the case order, and a skipped case stays skipped."""
  import threading  # pylint: disable=g-import-not-at-top
  from jax_llar.tools.loopback import harness as harness  # pylint: disable=g-import-not-at-top
  barrier = threading.Barrier(3, timeout=30)

  def go(i):
    barrier.wait()  # raises BrokenBarrierError unless three cases run at once
    return {"status": "pass", "i": i}

  def items():
    for i in range(4):
      reason = "not co-resident" if i == 1 else None
      yield {"status": "error", "i": i}, reason, (lambda i=i: go(i)), f"case {i}"

  rows = harness.run_cases(items(), lambda r: f"row {r['i']} {r['status']}",
                           in_process=False, jobs=4)
  assert [(r["i"], r["status"]) for r in rows] == [
      (0, "pass"), (1, "skipped"), (2, "pass"), (3, "pass")]
  printed = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("row")]
  assert printed == ["row 0 pass", "row 1 skipped", "row 2 pass", "row 3 pass"]


# --- call signatures and the signature faults ------------------------------------------


def test_call_signatures_mirror_the_native_rule():
  """loopback.h: LoopbackSignature = 1 + (seed + call) % 65535 and
  OtherSignature = 1 + (s - 1 + 32768) % 65535."""
  assert [lh.call_signature(0, c) for c in range(3)] == [1, 2, 3]
  assert lh.call_signature(65534, 0) == 65535 and lh.call_signature(65534, 1) == 1
  sigs = [lh.call_signature(7, c) for c in range(70000)]
  assert min(sigs) == 1 and max(sigs) == 65535
  assert all(a != b for a, b in zip(sigs, sigs[1:]))  # consecutive calls differ
  others = np.array([lh.other_signature(s) for s in range(1, 65536)])
  assert others.min() == 1 and others.max() == 65535
  assert not (others == np.arange(1, 65536)).any()


def test_expected_flags_by_protocol():
  # LL: the signature in the high half, 16 epoch bits; LL128: 32 epoch bits
  # in the low half, the signature beside; unsigned algorithms: signature 0.
  epoch = (1 << 32) + (5 << 16) + 12
  assert lh.expected_flags("one_shot_ll", epoch, 9) == ((9 << 16) | 13, 9)
  assert lh.expected_flags("two_shot_ll", epoch, 9) == ((9 << 16) | 13, 9)
  assert lh.expected_flags("one_shot_ll128", epoch, 9) == ((5 << 16) | 13, 9)
  assert lh.expected_flags("two_shot_ll128_atomic", epoch, 9) == ((5 << 16) | 13, 0)
  assert lh.ll_flag(2**16 + 4, 1) == (1 << 16) | 5


def test_signature_settings_faults_and_native_arguments():
  s = lh.Settings(calls=8)
  assert lh.validate(dataclasses.replace(s, signature_seed=65536))
  assert lh.fault_errors(s) == [] and lh.fault_errors(s, extra_call_rank=1, fault_call=7) == []
  assert any("one fault at a time" in e
             for e in lh.fault_errors(s, skip_rank=1, swap_signature_rank=0))
  assert any("carries no call signature" in e for e in lh.fault_errors(
      dataclasses.replace(s, algorithm="one_shot_sentinel"), extra_call_rank=1))
  assert any("needs signed calls" in e for e in lh.fault_errors(
      dataclasses.replace(s, signatures=False), swap_signature_rank=1))
  assert any("fault_call" in e for e in lh.fault_errors(s, extra_call_rank=1, fault_call=8))
  # The native defaults are the settings' defaults: nothing to pass.
  assert lh.signature_kwargs({"signatures": True, "signature_seed": 0}) == {}
  assert lh.signature_kwargs({"signatures": False}) == {"signatures": False,
                                                         "signature_seed": 0}
  spec = lh.fault_spec(s, lh.Case(3, "float32", 1024), -1, 0, fault="extra_call",
                       fault_rank=2, fault_call=4)
  assert lh.signature_kwargs(spec) == {"extra_call_rank": 2, "fault_call": 4}
  spec["fault"] = "swap_signature"
  assert lh.signature_kwargs(spec) == {"swap_signature_rank": 2, "fault_call": 4}


def _signature_fault(algorithm="one_shot_ll", fault="extra_call", reporters=(0, 1, 2)):
  s = lh.Settings(calls=8, timeout_ms=5000, algorithm=algorithm, signature_seed=40)
  spec = lh.fault_spec(s, lh.Case(3, "float32", 4096, 100), -1, 0, fault=fault,
                       fault_rank=1, fault_call=4)
  epoch, sig = 104, lh.call_signature(40, 4)
  other = lh.other_signature(sig)
  ll128 = algorithm in lh.LL128_ALGORITHMS
  records = []
  for i in range(3):
    r = dict(code=0, rank=0, peer=0, block=0, line=0, flag_expected=0, flag_seen=0,
             flag_seen2=0, epoch=0, waited_ns=0, signature_expected=0, signature_seen=0,
             flag_epoch_bits=0)
    if i in reporters:
      mine, theirs = (other, sig) if i == 1 else (sig, other)
      seen = lh.expected_flags(algorithm, epoch, theirs)[0]
      r.update(code=2, rank=i, peer=0 if i == 1 else 1, block=0, line=2, epoch=epoch,
               flag_expected=lh.expected_flags(algorithm, epoch, mine)[0], flag_seen=seen,
               flag_seen2=theirs if ll128 else seen, waited_ns=0,
               signature_expected=mine, signature_seen=theirs,
               flag_epoch_bits=32 if ll128 else 16)
    records.append(r)
  data = {"calls_launched": 5, "failed_call": 4, "deadline_exceeded": False,
          "cuda_error": "cudaErrorLaunchFailure: unspecified launch failure",
          "seconds_to_error": 3.5, "records": records,
          "signatures": [lh.call_signature(40, c) for c in range(5)],
          "fault_signature": other}
  return spec, data


@pytest.mark.parametrize("algorithm", ["one_shot_ll", "two_shot_ll", "one_shot_ll128",
                                       "two_shot_ll128"])
@pytest.mark.parametrize("fault", lh.SIGNATURE_FAULTS)
def test_signature_fault_verdict_accepts_the_expected_report(algorithm, fault):
  spec, data = _signature_fault(algorithm, fault)
  assert lh.fault_problems(spec, data) == []
  # One rank's report suffices (the first trap ends every simulated rank).
  spec, data = _signature_fault(algorithm, fault, reporters=(2,))
  assert lh.fault_problems(spec, data) == []


@pytest.mark.parametrize("change, words", [
    (lambda d: d.update(cuda_error=None), "was not stopped"),
    (lambda d: d.update(deadline_exceeded=True), "hang"),
    (lambda d: d.update(failed_call=5), "call 5"),
    (lambda d: d.update(fault_signature=3), "native harness used"),
    (lambda d: d["records"][0].update(code=1), "not 2 (foreign signature)"),
    (lambda d: d["records"][0].update(peer=2), "peer 2, not 1"),
    (lambda d: d["records"][1].update(peer=1), "itself"),
    (lambda d: d["records"][2].update(rank=0), "names rank 0"),
    (lambda d: d["records"][0].update(epoch=105), "epoch 105"),
    (lambda d: d["records"][0].update(signature_seen=d["records"][0]["signature_expected"]),
     "signatures"),
    (lambda d: d["records"][1].update(flag_seen=0), "flags"),
    (lambda d: d["records"][2].update(flag_epoch_bits=32), "flag_epoch_bits"),
    (lambda d: d["records"][0].update(waited_ns=5_000_000_000), "the whole timeout"),
    (lambda d: [r.update(code=0) for r in d["records"]], "no rank reported"),
    (lambda d: d.update(seconds_to_error=30.0), "more than the timeout"),
])
def test_signature_fault_verdict_names_each_problem(change, words):
  spec, data = _signature_fault()
  change(data)
  problems = lh.fault_problems(spec, data)
  assert any(words in p for p in problems), problems


def test_run_in_signature_fault_mode_runs_children(monkeypatch, capsys):
  seen = []

  def child(spec, env=None):
    del env
    seen.append(spec)
    if spec["world"] == 4:  # a child that never ends
      return {"data": None, "rc": None, "hung": True, "tail": ""}
    _, data = _signature_fault(fault=spec["fault"])
    return {"data": data, "rc": 0, "hung": False, "tail": ""}

  monkeypatch.setattr(lh, "run_fault_child", child)
  monkeypatch.setattr(lh.report, "environment", lambda: {"stub": True})
  s = lh.Settings(worlds=(3, 4), dtypes=("float32",), sizes=(4096,), calls=8,
                  timeout_ms=5000, start_epochs=(100,), signature_seed=40)
  result = lh.run(s, swap_signature_rank=1, fault_call=4)
  rows = result["rows"]
  assert [r["status"] for r in rows] == ["pass", "fail"]
  assert "a hang" in rows[1]["problems"][0]
  assert rows[0]["fault"] == "swap_signature" and rows[0]["fault_signature"]
  assert seen[0]["fault"] == "swap_signature" and seen[0]["fault_rank"] == 1
  assert result["settings"]["swap_signature_rank"] == 1
  assert "swap_signature rank 1 at call 4" in capsys.readouterr().out


class _SignedNative(FakeNative):
  """FakeNative that reports the signatures it gave the calls."""

  def __init__(self, offset=0, **kw):
    super().__init__(**kw)
    self.offset = offset

  def loopback(self, raw, dtype, calls, **kw):
    r = super().loopback(raw, dtype, calls, **kw)
    r["signatures"] = [lh.call_signature(0, c) + self.offset for c in range(calls)]
    return r


def test_run_case_checks_the_native_signatures(fake_run):
  s = dataclasses.replace(SMALL, worlds=(2,), dtypes=("float32",), sizes=(100,),
                          start_epochs=(0,))
  assert fake_run(_SignedNative(), s)["rows"][0]["status"] == "pass"
  row = fake_run(_SignedNative(offset=1), s)["rows"][0]
  assert row["status"] == "fail" and "signatures" in row["signature_mismatch"]


def test_cli_refuses_a_signature_fault_it_cannot_detect():
  p = _cli("--extra_call_rank=1", "--algorithm=one_shot_sentinel", "--dtypes=float32")
  assert p.returncode == 1 and "carries no call signature" in p.stdout, p.stdout
  p = _cli("--swap_signature_rank=1", "--skip_rank=0")
  assert p.returncode == 1 and "one fault at a time" in p.stdout, p.stdout


def test_run_cases_checks_ran_cases_in_threads_and_keeps_case_order(capsys):
  """A `Ran` case's check runs in a worker thread while the next cases run
  (two checks wait at a barrier that only both lift); the rows and lines
  keep the case order; a check's ValueError is that case's error row; a
  lost context after deferred cases still stops the later ones."""
  import threading  # pylint: disable=g-import-not-at-top
  barrier = threading.Barrier(2, timeout=30)

  def check(i):
    if i in (0, 1):
      barrier.wait()  # raises BrokenBarrierError unless both checks run at once
    if i == 2:
      raise ValueError("bad outputs")
    return {"status": "pass", "i": i}

  def items():
    for i in range(5):
      if i == 3:
        go = lambda: {"status": "fail", "i": 3, "cuda_error": "cudaErrorLaunchFailure"}
      else:
        go = lambda i=i: lh.Ran({"i": i}, lambda i=i: check(i))
      yield {"status": "error", "i": i}, None, go, f"case {i}"

  rows = lh.run_cases(items(), lambda r: f"row {r['i']} {r['status']}", check_threads=2)
  assert [(r["i"], r["status"]) for r in rows] == [
      (0, "pass"), (1, "pass"), (2, "error"), (3, "fail"), (4, "not_run")]
  assert "bad outputs" in rows[2]["reason"] and "case 3" in rows[4]["reason"]
  printed = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("row")]
  assert printed == ["row 0 pass", "row 1 pass", "row 2 error", "row 3 fail"]


def test_run_cases_bounds_the_bytes_waiting_for_checks():
  """Before a case runs, the cases still waiting for their checks hold at
  most max_waiting_bytes: with 600-byte cases, a bound of 500 lets none wait
  when case i starts, 1000 lets one, and the count bound alone
  (2 x check_threads) more. Deterministic: check i ends only once case
  i + k has started (k the cases the bound should let wait), so a harness
  that lets more wait is seen exactly, and one that waits for checks too
  eagerly times out the check's wait."""
  import threading  # pylint: disable=g-import-not-at-top
  n = 6

  def run(max_waiting_bytes, k):
    done, waiting_at_start = set(), []
    started = [threading.Event() for _ in range(n)]
    lock = threading.Lock()

    def check(i):
      if i + k < n:
        assert started[i + k].wait(timeout=20), f"case {i + k} never started"
      with lock:
        done.add(i)
      return {"status": "pass", "i": i}

    def go(i):
      with lock:
        waiting_at_start.append(i - len(done))
      started[i].set()
      return lh.Ran({"i": i}, lambda: check(i), nbytes=600)

    def items():
      for i in range(n):
        yield {"status": "error", "i": i}, None, (lambda i=i: go(i)), f"case {i}"

    rows = lh.run_cases(items(), lambda r: "", check_threads=4,
                        max_waiting_bytes=max_waiting_bytes)
    assert [(r["i"], r["status"]) for r in rows] == [(i, "pass") for i in range(n)], rows
    return max(waiting_at_start)

  assert run(max_waiting_bytes=500, k=0) == 0
  assert run(max_waiting_bytes=1000, k=1) == 1
  assert run(max_waiting_bytes=1 << 30, k=3) >= 3  # up to 2 x check_threads


def test_a_deferred_case_checks_as_an_immediate_one():
  """run_case(defer=True)'s finish() gives the row run_case gives at once,
  for a correct case and for a corrupted one."""
  s = dataclasses.replace(SMALL, worlds=(3,), dtypes=("bfloat16",), sizes=(100,),
                          start_epochs=(0,))
  case = lh.Case(3, "bfloat16", 100)
  for corrupt in (None, (1, 2, 7)):
    now = lh.run_case(FakeNative(corrupt=corrupt), s, case, np.random.default_rng(3))
    later = lh.run_case(FakeNative(corrupt=corrupt), s, case, np.random.default_rng(3),
                        defer=True)
    assert isinstance(later, lh.Ran)
    # What it holds until checked: the inputs (sets x ranks x 100 bytes) and
    # the kept calls' outputs (calls x ranks x 100 bytes).
    assert later.nbytes == (s.sets + lh.kept_calls(s, case)) * 3 * 100, later.nbytes
    assert json.dumps(later.finish(), sort_keys=True) == json.dumps(now, sort_keys=True)
    assert now["status"] == ("pass" if corrupt is None else "fail")
