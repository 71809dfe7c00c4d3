"""Tuning tables on CPU: files, precedence, decisions through the lowering,
status, the builder and the tune command.

The devices' architecture is what decides which table applies; CPU devices
have none, so the tests that need one replace ``tuning.architecture_of``
(the one function that reads it from a device). Settings are set per test
and restored (monkeypatch), and the tables read are forgotten around each
test (``table_lookup.clear_cache``). Nothing here is timed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax._src.sharding_impls import SPMDAxisContext
from jax.sharding import PartitionSpec as P

import jax_llar
from jax_llar import dispatch, table_lookup, tuning
from jax_llar.algorithms import Algorithm
from jax_llar.config import settings as llar_settings
from jax_llar.tools.bench import jax_level as jax_level
from jax_llar.tools.tune import tables as tune_tables
from jax_llar.tools.tune import plan as tune

from cpu_helpers import mesh_of, user_env

ROOT = pathlib.Path(__file__).resolve().parent.parent
ONE_SHOT_LL = Algorithm.ONE_SHOT_LL
TWO_SHOT_LL = Algorithm.TWO_SHOT_LL
SHIPPED_FILE = tuning.SHIPPED_DIR / "sm_90-2ranks.json"
PROVENANCE = {k: None for k in tuning.PROVENANCE_KEYS}

# A table for 4 ranks with every kind of row (lax.psum between fast paths).
ROWS_4 = [{"max_bytes": 1024, "algorithm": "one_shot_ll"},
          {"max_bytes": 65536, "algorithm": "lax.psum"},
          {"max_bytes": 131072, "algorithm": "one_shot_ll"},
          {"max_bytes": 4194304, "algorithm": "two_shot_ll"}]


def _table(arch="sm_90", ranks=2, rows=None, **extra):
  d = {"format": tuning.FORMAT, "architecture": arch, "ranks": ranks,
       "rows": rows if rows is not None else [{"max_bytes": 1024,
                                               "algorithm": "one_shot_ll"}],
       "provenance": dict(PROVENANCE, command="test")}
  d.update(extra)
  return d


def _write(path: pathlib.Path, data) -> pathlib.Path:
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(data if isinstance(data, str) else json.dumps(data))
  return path


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
  """Each test: an empty tuning directory of its own, no forced file, no
  table remembered before or after."""
  monkeypatch.setattr(llar_settings, "tuning_dir", str(tmp_path / "user"))
  monkeypatch.setattr(llar_settings, "tuning_file", "")
  table_lookup.clear_cache()
  yield
  table_lookup.clear_cache()


@pytest.fixture
def arch(monkeypatch):
  """Gives every device the architecture set in the returned dict (by
  device id; key "all" for every device)."""
  by_id = {"all": "sm_90"}

  def architecture_of(device):
    return by_id.get(device.id, by_id["all"])

  monkeypatch.setattr(tuning, "architecture_of", architecture_of)
  return by_id


# --- the file format --------------------------------------------------------------


@pytest.mark.parametrize("content,message", [
    ("{not json", "is not JSON"),
    ([], "not a JSON object"),
    (_table(format="jax_llar.tuning/0"), "format must be 'jax_llar.tuning/1'"),
    ({k: v for k, v in _table().items() if k != "rows"}, "missing rows"),
    (_table(extra=1), "unknown extra"),
    (_table(provenance={"command": "x"}), "provenance lacks results_files"),
    (_table(provenance=[]), "provenance must be a JSON object"),
    (_table(rows={"max_bytes": 4}), "rows must be a list"),
    (_table(rows=[{"max_bytes": 64}]), "row 1 must be an object with exactly"),
    (_table(rows=[{"max_bytes": 64, "algorithm": "one_shot_ll", "x": 1}]),
     "row 1 must be an object with exactly"),
    (_table(rows=[{"max_bytes": 64, "algorithm": "three_shot"}]),
     "row 1: unknown algorithm 'three_shot'"),
    (_table(rows=[{"max_bytes": 1024, "algorithm": "one_shot_ll"},
                  {"max_bytes": 512, "algorithm": "two_shot_ll"}]),
     "row 2: max_bytes 512 is not above row 1's 1024"),
    (_table(rows=[{"max_bytes": 524288, "algorithm": "one_shot_ll"}]),
     "row 1: max_bytes 524288 is above 262144, the most one_shot_ll serves"),
    (_table(rows=[{"max_bytes": "64", "algorithm": "one_shot_ll"}]),
     "row 1: max_bytes must be a positive int"),
    (_table(ranks=1), "ranks must be an int in 2..16"),
    (_table(ranks=32), "ranks must be an int in 2..16"),
    (_table(ranks="2"), "ranks must be an int"),
    (_table(arch="9.0"), "architecture must look like 'sm_90'"),
    (_table(rows=[{"max_bytes": 64, "algorithm": "one_shot_ll"},
                  {"max_bytes": 128, "algorithm": "lax.psum"}]),
     "the last, chooses lax.psum"),
])
def test_a_broken_file_is_a_clear_error_naming_it(tmp_path, content, message):
  path = _write(tmp_path / "t.json", content)
  with pytest.raises(tuning.TuningTableError) as e:
    tuning.load(path)
  assert str(e.value).startswith(f"jax_llar tuning table {path}: ")
  assert message in str(e.value), str(e.value)


def test_a_file_round_trips(tmp_path):
  data = _table(ranks=4, rows=ROWS_4)
  path = tuning.write(data, tmp_path)
  assert os.path.basename(path) == "sm_90-4ranks.json"
  t = tuning.load(path)
  assert (t.architecture, t.ranks, t.source) == ("sm_90", 4, path)
  assert [r.name for r in t.rows] == ["one_shot_ll", "lax.psum", "one_shot_ll",
                                      "two_shot_ll"]
  assert tuning.to_dict(t) == data
  assert pathlib.Path(path).read_text() == tuning.dumps(data)
  with pytest.raises(tuning.TuningTableError, match="merge them"):
    tuning.write(_table(rows=[{"max_bytes": 64, "algorithm": "one_shot_ll"},
                              {"max_bytes": 128, "algorithm": "one_shot_ll"}]), tmp_path)


def test_architecture_names():
  assert tuning.architecture_name("9.0") == "sm_90"
  assert tuning.architecture_name("10.0") == "sm_100"
  assert tuning.architecture_name("12.1") == "sm_121"
  for bad in (None, "", "9", "x.y", "9.0.1"):
    assert tuning.architecture_name(bad) is None
  cpu = jax.devices()[0]
  assert tuning.architecture_of(cpu) is None  # not a CUDA GPU

  class Gpu:
    platform = "gpu"
    compute_capability = "9.0"

  assert tuning.architecture_of(Gpu()) == "sm_90"


# --- precedence: forced file > tuning directory > shipped > default rule ------------------


def test_precedence(tmp_path, monkeypatch):
  user = pathlib.Path(llar_settings.tuning_dir)
  # Nothing for sm_80: the default rule, and why.
  found = table_lookup.lookup("sm_80", 2)
  assert (found.origin, found.table) == ("default", None)
  assert found.note == "no tuning table for sm_80 x 2 ranks"
  # sm_90 x 2: the shipped table.
  found = table_lookup.lookup("sm_90", 2)
  assert (found.origin, found.note) == ("shipped", str(SHIPPED_FILE))
  assert found.table == tuning.load(SHIPPED_FILE)
  # A table in the tuning directory comes first.
  _write(user / "sm_90-2ranks.json", _table(rows=[{"max_bytes": 2048,
                                                   "algorithm": "one_shot_ll"}]))
  found = table_lookup.lookup("sm_90", 2)
  assert (found.origin, found.table.rows[0].max_bytes) == ("user", 2048)
  assert found.table.source == str(user / "sm_90-2ranks.json")
  # The forced file, for its own pair, comes before both.
  forced = _write(tmp_path / "mine.json", _table(rows=[{"max_bytes": 64,
                                                         "algorithm": "one_shot_ll"}]))
  monkeypatch.setattr(llar_settings, "tuning_file", str(forced))
  found = table_lookup.lookup("sm_90", 2)
  assert (found.origin, found.table.rows[0].max_bytes, found.note) == (
      "file", 64, str(forced))
  # ... and leaves other pairs to the directory, the shipped tables, the rule.
  assert table_lookup.lookup("sm_80", 2).origin == "default"
  _write(user / "sm_90-4ranks.json", _table(ranks=4, rows=ROWS_4))
  assert table_lookup.lookup("sm_90", 4).origin == "user"
  # A forced file for another pair: the directory's table serves sm_90 x 2.
  _write(forced, _table(ranks=8))
  assert table_lookup.lookup("sm_90", 2).origin == "user"
  assert table_lookup.lookup("sm_90", 8).origin == "file"
  # The directory's file is read again after it changes.
  _write(user / "sm_90-2ranks.json", _table(rows=[{"max_bytes": 4096,
                                                   "algorithm": "one_shot_ll"}]))
  os.utime(user / "sm_90-2ranks.json", ns=(1, 1))
  assert table_lookup.lookup("sm_90", 2).table.rows[0].max_bytes == 4096
  # Unknown architecture (not CUDA GPUs): no table, the default rule.
  found = table_lookup.lookup(None, 2)
  assert (found.origin, found.table) == ("default", None)
  assert "architecture unknown" in found.note


def test_broken_or_misnamed_files_fail_naming_them(tmp_path, monkeypatch):
  user = pathlib.Path(llar_settings.tuning_dir)
  # A file in the tuning directory that holds another pair's table.
  path = _write(user / "sm_90-2ranks.json", _table(ranks=4, rows=ROWS_4))
  with pytest.raises(tuning.TuningTableError,
                     match="holds the table for sm_90 x 4 ranks, but its name is for "
                           "sm_90 x 2 ranks") as e:
    table_lookup.lookup("sm_90", 2)
  assert str(path) in str(e.value) and "JAX_LLAR_TUNING_DIR" in str(e.value)
  # A broken forced file fails whatever the pair, even an unknown one.
  forced = _write(tmp_path / "bad.json", "{")
  monkeypatch.setattr(llar_settings, "tuning_file", str(forced))
  for pair in (("sm_80", 2), (None, 4)):
    with pytest.raises(tuning.TuningTableError, match="is not JSON") as e:
      table_lookup.lookup(*pair)
    assert str(forced) in str(e.value) and "JAX_LLAR_TUNING_FILE" in str(e.value)
  monkeypatch.setattr(llar_settings, "tuning_file", str(tmp_path / "missing.json"))
  with pytest.raises(tuning.TuningTableError, match="missing.json: does not exist"):
    table_lookup.lookup("sm_90", 2)


# --- decisions through the lowering -----------------------------------------------------


def _decide(nbytes, ranks=4, dtype=np.float32, op="psum"):
  """The lowering's decision for a psum of `nbytes` per rank over `ranks`
  of the 8 CPU devices (groups of `ranks`), lowered for CPU: its candidate
  is what CUDA GPUs would run."""
  ctx = SPMDAxisContext(mesh_of((8 // ranks, ranks), ("a", "b")))
  aval = jax.core.ShapedArray((nbytes // np.dtype(dtype).itemsize,), np.dtype(dtype))
  return dispatch.decide(ctx, aval, ("b",), platform="cpu", op=op)


def _outcome(d):
  """The candidate (what GPUs would run), or the payload reason."""
  return d.candidate if d.reason == "platform" else d.reason


@pytest.mark.parametrize("dtype", [np.float32, np.dtype("bfloat16"), np.int32], ids=str)
def test_lowering_pins_every_boundary_of_the_shipped_table(arch, dtype):
  del arch  # every device is sm_90: the shipped sm_90 x 2 table serves
  item = np.dtype(dtype).itemsize
  got = [_outcome(_decide(b, ranks=2, dtype=dtype))
         for b in (item, 262144 - item, 262144, 262144 + item, 4194304 - item, 4194304,
                   4194304 + item)]
  assert got == [ONE_SHOT_LL, ONE_SHOT_LL, ONE_SHOT_LL, TWO_SHOT_LL, TWO_SHOT_LL,
                 TWO_SHOT_LL, "size"]
  # Above the last row (4 MiB, also the default size cap): lax.psum.
  d = _decide(4194304 + item, ranks=2, dtype=dtype)
  assert "JAX_LLAR_MAX_BYTES" in d.detail


def test_lowering_pins_every_boundary_of_a_synthetic_table(arch, monkeypatch):
  del arch
  _write(pathlib.Path(llar_settings.tuning_dir) / "sm_90-4ranks.json",
         _table(ranks=4, rows=ROWS_4))
  points = [4, 1020, 1024, 1028, 65532, 65536, 65540, 131068, 131072, 131076,
            4194300, 4194304, 4194308]
  assert [_outcome(_decide(b)) for b in points] == [
      ONE_SHOT_LL, ONE_SHOT_LL, ONE_SHOT_LL, "table", "table", "table", ONE_SHOT_LL,
      ONE_SHOT_LL, ONE_SHOT_LL, TWO_SHOT_LL, TWO_SHOT_LL, TWO_SHOT_LL, "size"]
  d = _decide(2048)
  assert d.detail.startswith("lax.psum by row 2 of the tuning table for sm_90 x 4 "
                             "ranks (1025 to 65536 bytes per rank: lax.psum; ")
  # The forced algorithm overrides the table (also its lax.psum row), within
  # its MAX_BYTES.
  monkeypatch.setattr(llar_settings, "algorithm", "one_shot_ll")
  assert [_outcome(_decide(b)) for b in (2048, 262144, 262148)] == [
      ONE_SHOT_LL, ONE_SHOT_LL, "size"]
  monkeypatch.setattr(llar_settings, "algorithm", "auto")
  # The size cap stays an upper cap: one element below, at and above it.
  monkeypatch.setattr(llar_settings, "max_bytes", 200000)
  assert [_outcome(_decide(b)) for b in (131076, 199996, 200000, 200004)] == [
      TWO_SHOT_LL, TWO_SHOT_LL, TWO_SHOT_LL, "size"]
  # The fused op has one kernel, on the one-shot's exchange: no table.
  monkeypatch.setattr(llar_settings, "max_bytes", 4194304)
  d = _decide(2048, op="psum_add_rms_norm")
  assert d.candidate is ONE_SHOT_LL


def test_no_table_default_rule_logged_once(arch, caplog):
  caplog.set_level(logging.INFO, logger="jax_llar")
  arch["all"] = "sm_80"
  assert [_outcome(_decide(b)) for b in (262140, 262144, 262148)] == [
      ONE_SHOT_LL, ONE_SHOT_LL, "size"]
  d = _decide(262148)
  assert d.detail == ("more than 262144 bytes per rank, the most one_shot_ll serves "
                      "(no tuning table for sm_80 x 4 ranks: default rule)")
  said = [r for r in caplog.records
          if r.getMessage().startswith("jax_llar: no tuning table")]
  assert len(said) == 1, [r.getMessage() for r in said]
  assert said[0].getMessage().startswith(
      "jax_llar: no tuning table for sm_80 x 4 ranks: the default rule decides "
      "(one_shot_ll up to 262144 bytes per rank, lax.psum above); ")
  assert "python -m jax_llar.tools.tune" in said[0].getMessage()
  assert said[0].levelno == logging.WARNING


def test_devices_of_several_architectures_fall_back(arch):
  arch.update({i: "sm_100" for i in range(0, 8, 2)})  # even ids sm_100, odd sm_90
  d = _decide(1024)
  assert (d.reason, d.candidate, d.fast) == ("architecture", None, False)
  assert "differ in architecture (sm_100, sm_90)" in d.detail
  # A payload reason still comes first.
  assert _decide(1024, dtype=np.int16).reason == "dtype"


def test_cpu_devices_take_the_default_rule_silently(caplog):
  """Without an architecture (CPU devices) the default rule gives the
  candidate, and nothing is logged about tables."""
  caplog.set_level(logging.DEBUG, logger="jax_llar")
  assert _outcome(_decide(262144, ranks=2)) is ONE_SHOT_LL
  assert _decide(262148, ranks=2).reason == "size"
  assert not [r for r in caplog.records if "tuning table" in r.getMessage()]


def test_a_tuning_file_change_relowers_jitted_functions(arch, tmp_path):
  del arch
  mesh = mesh_of((4,), ("x",))
  traces = []

  def body(v):
    traces.append(1)
    return jax_llar.psum(v, "x")

  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P()))
  x = np.ones(4 * 512, np.float32)  # 2048 bytes per rank
  f(x)
  assert jax_llar.dispatch_log()[-1].candidate is ONE_SHOT_LL  # default rule
  path = _write(tmp_path / "t.json", _table(ranks=4, rows=ROWS_4))
  llar_settings.tuning_file = str(path)  # the fixture restores it
  np.testing.assert_array_equal(np.asarray(f(x)), 4.0)
  d = jax_llar.dispatch_log()[-1]
  assert (d.reason, d.candidate) == ("table", None) and "row 2" in d.detail
  assert len(traces) == 2


# --- status -----------------------------------------------------------------------------


def test_status_reports_the_tables_in_use(arch):
  s = jax_llar.status()["tuning"]
  assert s["tables"] == [] and "sm_90-2ranks.json" in s["shipped"]
  assert s["tuning_file"] is None
  assert s["tuning_dir"] == llar_settings.tuning_dir
  _decide(1024, ranks=2)
  arch["all"] = "sm_80"
  _decide(1024, ranks=4)
  tables = jax_llar.status()["tuning"]["tables"]
  assert [(t["architecture"], t["ranks"], t["origin"]) for t in tables] == [
      ("sm_80", 4, "default"), ("sm_90", 2, "shipped")]
  default, shipped = tables
  assert default["note"] == "no tuning table for sm_80 x 4 ranks"
  assert default["rule"].startswith("default rule: one_shot_ll up to 262144 bytes")
  assert (default["path"], default["rows"], default["provenance"]) == (None, None, None)
  assert shipped["path"] == str(SHIPPED_FILE)
  assert shipped["rows"] == [{"max_bytes": 262144, "algorithm": "one_shot_ll"},
                             {"max_bytes": 4194304, "algorithm": "two_shot_ll"}]
  prov = shipped["provenance"]
  assert prov["results_files"] == ["benchmarks/results/h200x2-20261201-tune-1bda736.json"]
  assert (prov["gpu"], prov["gpu_count"], prov["jax"], prov["nccl"]) == (
      "NVIDIA H200", 2, "0.11.2", "2.28.9")
  assert prov["command"].startswith("python -m jax_llar.tools.tune --from_results=")
  assert prov["note"].startswith("Chooses only among what was measured on 2 ranks: "
                                 "lax.psum, one_shot_ll, two_shot_ll; any other algorithm "
                                 "was never measured here")
  json.dumps(jax_llar.status()["tuning"])  # JSON-ready


# --- the shipped table comes from its results file --------------------------------------


def test_the_shipped_table_is_rebuilt_exactly_from_its_results_file(tmp_path):
  """The command recorded in the shipped table, run again on the results
  file it names, writes the same bytes: the table cannot drift from its
  source."""
  prov = json.loads(SHIPPED_FILE.read_text())["provenance"]
  (results,) = prov["results_files"]
  digest = hashlib.sha256((ROOT / results).read_bytes()).hexdigest()
  assert prov["results_sha256"] == [digest]
  cmd = prov["command"].split()
  assert cmd[:3] == ["python", "-m", "jax_llar.tools.tune"]
  p = subprocess.run([sys.executable, "-m", "jax_llar.tools.tune", *cmd[3:],
                      f"--out={tmp_path}"], cwd=ROOT, env=user_env(),
                     capture_output=True, text=True, timeout=300)
  assert p.returncode == 0, p.stdout + p.stderr
  assert ("sm_90 x 2 ranks: <= 262144 B: one_shot_ll, <= 4194304 B: two_shot_ll"
          in p.stdout)
  assert (tmp_path / SHIPPED_FILE.name).read_bytes() == SHIPPED_FILE.read_bytes()


def test_the_shipped_tables_source_was_checked_and_covers_what_it_claims():
  prov = json.loads(SHIPPED_FILE.read_text())["provenance"]
  result = json.loads((ROOT / prov["results_files"][0]).read_text())
  used = [r for r in result["rows"]
          if r["impl"] in ("lax.psum", "llar.one_shot_ll", "llar.two_shot_ll")]
  assert used and all(r["correct"] is True for r in used)
  assert all(r["fast_path"] is True for r in used if r["impl"] != "lax.psum")
  assert {r["world_size"] for r in used} == {2}
  assert prov["measured"] == {
      "sizes": sorted({r["bytes_per_rank"] for r in used}),
      "dtypes": sorted({r["dtype"] for r in used}),
      "implementations": ["lax.psum", "one_shot_ll", "two_shot_ll"]}
  assert max(prov["measured"]["sizes"]) == 16777216
  assert prov["commit"] == result["env"]["git_commit"]


# --- the builder's rule -----------------------------------------------------------------


def _results(tmp_path, rows, name="r.json", caps=("9.0", "9.0"), **env):
  base = {"date": "2026-01-01", "jax": "0.11.2", "devices": ["NVIDIA H200"] * 2,
          "device_count": 2, "git_commit": "abc", "nccl_runtime": 22809,
          "compute_capabilities": list(caps) if caps else None}
  base.update(env)
  return str(_write(tmp_path / name, {"env": base, "level": "jax", "rows": rows}))


def _row(impl, nbytes, us, dtype="float32", world=2, correct=True, fast=True, **kw):
  r = {"impl": impl, "world_size": world, "dtype": dtype, "bytes_per_rank": nbytes,
       "us_per_call": us, "correct": correct,
       "fast_path": (fast if impl.startswith("llar.") else None)}
  r.update(kw)
  return r


def _build(paths, **kw):
  return tune_tables.build_tables(paths, command="test", **kw)


def test_builder_rule_margin_dtypes_merging(tmp_path):
  rows = []
  # size: (lax.psum f32, bf16), (one_shot f32, bf16), (two_shot f32, bf16)
  times = {64: ((20, 20), (4, 4), (9, 9)),          # one-shot
           1024: ((20, 20), (19.2, 4), None),       # 4% better in f32: lax.psum
           2048: ((20, 20), (18.8, 18.8), None),    # 6% better: one-shot
           4096: ((20, 20), (10, 30), None),        # slower in bf16: lax.psum
           8192: ((20, 20), (5, 5), (5, 5)),        # tie: the lower id, one-shot
           16384: ((20, 20), (5, 6), (5.5, 5.5)),   # worst ratio: two-shot
           32768: ((20, 20), (5, 5), (4, 4)),       # two-shot
           65536: ((20, 20), (25, 25), (30, 30))}   # lax.psum: dropped at the end
  for size, (psum, one, two) in times.items():
    for i, dt in enumerate(("float32", "bfloat16")):
      rows.append(_row("lax.psum", size, psum[i], dt))
      rows.append(_row("llar.one_shot_ll", size, one[i], dt))
      if two:
        rows.append(_row("llar.two_shot_ll", size, two[i], dt, algorithm="two_shot_ll"))
      rows.append(_row("ffi.copy", size, 1.0, dt))  # not a candidate: ignored
  (t,) = _build([_results(tmp_path, rows)])
  assert t["rows"] == [
      {"max_bytes": 64, "algorithm": "one_shot_ll"},
      {"max_bytes": 1024, "algorithm": "lax.psum"},
      {"max_bytes": 2048, "algorithm": "one_shot_ll"},
      {"max_bytes": 4096, "algorithm": "lax.psum"},
      {"max_bytes": 8192, "algorithm": "one_shot_ll"},
      {"max_bytes": 32768, "algorithm": "two_shot_ll"}]
  assert (t["architecture"], t["ranks"]) == ("sm_90", 2)
  prov = t["provenance"]
  assert prov["architecture_from"] == "the result files' compute capabilities"
  assert prov["measured"]["implementations"] == ["lax.psum", "one_shot_ll", "two_shot_ll"]
  assert [e["choice"] for e in prov["evidence"]] == [
      "one_shot_ll", "lax.psum", "one_shot_ll", "lax.psum", "one_shot_ll",
      "two_shot_ll", "two_shot_ll", "lax.psum"]
  assert prov["evidence"][1]["score"] == {"one_shot_ll": 0.96}
  tuning.from_dict(t)  # a valid table
  # A larger margin turns the 6% win into lax.psum.
  (t,) = _build([_results(tmp_path, rows)], margin=0.1)
  assert {"max_bytes": 2048, "algorithm": "one_shot_ll"} not in t["rows"]
  assert "(margin 0.1)" in t["provenance"]["rule"]


def test_builder_candidates_and_refusals(tmp_path):
  ok = [_row("lax.psum", 64, 20), _row("llar.one_shot_ll", 64, 4)]
  # A jax_llar row that fell back is no candidate.
  (t,) = _build([_results(tmp_path, [_row("lax.psum", 64, 20),
                                     _row("llar.one_shot_ll", 64, 4, fast=False)])])
  assert t["rows"] == []
  (t,) = _build([_results(tmp_path, [_row("lax.psum", 64, 20),
                                     _row("llar.two_shot_ll", 64, 4, algorithm=None)])])
  assert t["rows"] == []
  # A wrong result stops the build, whichever implementation it is.
  for bad in (_row("llar.one_shot_ll", 64, 4, correct=False),
              _row("lax.psum", 64, 20, correct=False)):
    with pytest.raises(tune_tables.TuningBuildError, match="matched no reference"):
      _build([_results(tmp_path, [r for r in ok if r["impl"] != bad["impl"]] + [bad])])
  with pytest.raises(tune_tables.TuningBuildError, match="has no lax.psum row"):
    _build([_results(tmp_path, [_row("llar.one_shot_ll", 64, 4)])])
  with pytest.raises(tune_tables.TuningBuildError, match="measured twice"):
    _build([_results(tmp_path, ok, "a.json"), _results(tmp_path, ok, "b.json")])
  with pytest.raises(tune_tables.TuningBuildError, match="not positive"):
    _build([_results(tmp_path, [_row("lax.psum", 64, 20),
                                _row("llar.one_shot_ll", 64, -0.1)])])
  with pytest.raises(tune_tables.TuningBuildError, match="no lax.psum or jax_llar rows"):
    _build([_results(tmp_path, [_row("ffi.copy", 64, 1)])])
  with pytest.raises(tune_tables.TuningBuildError, match="names no algorithm"):
    _build([_results(tmp_path, [_row("lax.psum", 64, 20), _row("llar.nine", 64, 4)])])
  with pytest.raises(tune_tables.TuningBuildError, match="margin"):
    _build([_results(tmp_path, ok)], margin=1.0)
  # The architecture: recorded, given, contradicting, unknown.
  with pytest.raises(tune_tables.TuningBuildError, match="contradicts"):
    _build([_results(tmp_path, ok)], architecture="sm_100")
  with pytest.raises(tune_tables.TuningBuildError, match="give the architecture"):
    _build([_results(tmp_path, ok, caps=None)])
  (t,) = _build([_results(tmp_path, ok, caps=None)], architecture="sm_100")
  assert t["architecture"] == "sm_100"
  assert "given on the command line" in t["provenance"]["architecture_from"]
  with pytest.raises(tune_tables.TuningBuildError, match="several architectures"):
    _build([_results(tmp_path, ok, "a.json"),
            _results(tmp_path, [_row("lax.psum", 128, 20)], "b.json",
                     caps=("10.0", "10.0"))])


def test_builder_chooses_an_unsigned_algorithm_only_when_allowed(tmp_path):
  """The sentinel's lines carry no call signature (algorithms.SIGNED): the
  builder leaves its rows out, and says so, unless allow_unsigned."""
  rows = [_row("lax.psum", 64, 20), _row("llar.one_shot_ll", 64, 4),
          _row("llar.one_shot_sentinel", 64, 3, algorithm="one_shot_sentinel"),
          _row("lax.psum", 128, 20), _row("llar.one_shot_ll", 128, 30),
          _row("llar.one_shot_sentinel", 128, 5, algorithm="one_shot_sentinel")]
  path = _results(tmp_path, rows)
  (t,) = _build([path])
  assert t["rows"] == [{"max_bytes": 64, "algorithm": "one_shot_ll"}]
  assert "one_shot_sentinel were left out: their lines carry no call signature" in (
      t["provenance"]["note"])
  (t,) = _build([path], allow_unsigned=True)
  assert t["rows"] == [{"max_bytes": 128, "algorithm": "one_shot_sentinel"}]
  assert "carry no call signature" not in t["provenance"]["note"]
  assert tune.from_results_command([path], None, tune_tables.DEFAULT_MARGIN,
                                        True).endswith(" --allow_unsigned")


def test_builder_one_table_per_number_of_ranks_from_several_files(tmp_path):
  a = _results(tmp_path, [_row("lax.psum", 64, 20), _row("llar.one_shot_ll", 64, 4)],
               "a.json")
  b = _results(tmp_path, [_row("lax.psum", 64, 30, world=4),
                          _row("llar.one_shot_ll", 64, 5, world=4),
                          _row("lax.psum", 128, 30, world=4),
                          _row("llar.one_shot_ll", 128, 5, world=4)], "b.json",
               git_commit="def")
  t2, t4 = _build([a, b])
  assert (t2["ranks"], t2["rows"]) == (2, [{"max_bytes": 64, "algorithm": "one_shot_ll"}])
  assert (t4["ranks"], t4["rows"]) == (4, [{"max_bytes": 128, "algorithm": "one_shot_ll"}])
  assert t4["provenance"]["results_files"] == [a, b]
  assert t4["provenance"]["commit"] == "abc, def"


# --- the tune command -------------------------------------------------------------------


def test_tune_without_gpus_exits_with_its_message():
  p = subprocess.run([sys.executable, "-m", "jax_llar.tools.tune", "--max_bytes=64"],
                     cwd=ROOT, env=dict(user_env(), JAX_PLATFORMS="cpu"),
                     capture_output=True, text=True, timeout=120)
  assert p.returncode == 1, p.stdout + p.stderr
  assert "measuring needs at least 2 CUDA GPUs" in p.stdout
  assert "--from_results builds tables" in p.stdout
  assert "Traceback" not in p.stderr


def test_tune_from_results_refuses_a_wrong_run(tmp_path):
  bad = _results(tmp_path, [_row("lax.psum", 64, 20),
                            _row("llar.one_shot_ll", 64, 4, correct=False)])
  p = subprocess.run([sys.executable, "-m", "jax_llar.tools.tune",
                      f"--from_results={bad}", f"--out={tmp_path / 'out'}"],
                     cwd=ROOT, env=user_env(), capture_output=True, text=True, timeout=120)
  assert p.returncode == 1 and "no table written" in p.stdout, p.stdout + p.stderr
  assert not (tmp_path / "out").exists()


def test_tune_plan():
  assert tune.default_ranks(1) == []
  assert tune.default_ranks(2) == [2]
  assert tune.default_ranks(6) == [2, 4, 6]
  assert tune.default_ranks(8) == [2, 4, 8]
  assert tune.default_ranks(32) == [2, 4, 8, 16]
  sizes = tune.default_sizes(8, 64 << 20)
  assert (sizes[0], sizes[-1], len(sizes)) == (8, 64 << 20, 24)
  assert tune.default_sizes(5, 40) == [8, 16, 32]
  assert tune.chain_lengths(256 << 10, 32, 512, 256 << 10) == (32, 512)
  assert tune.chain_lengths(1 << 20, 32, 512, 256 << 10) == (8, 128)
  assert tune.chain_lengths(64 << 20, 32, 512, 256 << 10) == (2, 16)
  assert tune.from_results_command(["a.json", "b.json"], "sm_90", 0.05) == (
      "python -m jax_llar.tools.tune --from_results=a.json,b.json --architecture=sm_90")
  assert tune.from_results_command(["a.json"], None, 0.1).endswith(
      "--from_results=a.json --margin=0.1")


def test_forced_measurement_on_cpu_records_the_fallback():
  """The JAX level's forced measurement (what tune runs): on CPU a forced
  algorithm falls back, and its row says so (no algorithm, fast_path False,
  the lax.psum reference); the settings are restored."""
  before = (llar_settings.algorithm, llar_settings.max_bytes)
  rows = jax_level.measure(["lax.psum", TWO_SHOT_LL.impl], mesh_of((2,), ("x",)),
                           np.dtype(np.float32), 64, 2, 4, 2, 1,
                           np.random.default_rng(0), forced={TWO_SHOT_LL.impl: TWO_SHOT_LL})
  assert (llar_settings.algorithm, llar_settings.max_bytes) == before
  psum, forced = rows
  assert (psum["impl"], psum["correct"], psum["algorithm"]) == ("lax.psum", True, None)
  assert (forced["impl"], forced["fast_path"], forced["algorithm"]) == (
      "llar.two_shot_ll", False, None)
  assert forced["correct"] and forced["reference"] == jax_level.LAX_PSUM
  # It was forced: on CUDA GPUs it would have run the two-shot.
  d = jax_llar.dispatch_log()[-1]
  assert (d.reason, d.candidate, d.bytes_per_rank) == ("platform", TWO_SHOT_LL, 64)


def _atomicity(tmp_path, name, writer, reader, passed=True, over_nvlink=True):
  return str(_write(tmp_path / name, {
      "level": "store_atomicity", "over_nvlink": over_nvlink, "passed": passed,
      "complete": True, "torn_lines": 0 if passed else 3, "bad_words": 0,
      "verdict": "no torn line" if passed else "torn lines",
      "settings": {"writer_device": writer, "reader_device": reader}}))


def test_builder_chooses_ll128_only_with_cross_device_store_atomicity(tmp_path):
  """LL128 rests on 128-byte stores arriving whole (algorithms.
  NEEDS_STORE_ATOMICITY): without passing cross-device records in both
  directions its rows are left out, and the note says why."""
  rows = [_row("lax.psum", 64, 20), _row("llar.one_shot_ll", 64, 4),
          _row("llar.one_shot_ll128", 64, 3, algorithm="one_shot_ll128")]
  path = _results(tmp_path, rows)
  (t,) = _build([path])
  assert t["rows"] == [{"max_bytes": 64, "algorithm": "one_shot_ll"}]
  assert "one_shot_ll128 were left out" in t["provenance"]["note"]
  assert "no store-atomicity record given" in t["provenance"]["note"]
  one_way = _atomicity(tmp_path, "a01.json", 0, 1)
  back = _atomicity(tmp_path, "a10.json", 1, 0)
  same_device = _atomicity(tmp_path, "a00.json", 0, 0, over_nvlink=False)
  torn = _atomicity(tmp_path, "torn.json", 1, 0, passed=False)
  for records, why in (([same_device], "no record ran across two devices"),
                       ([one_way], "no record in the direction writer 1 -> reader 0"),
                       ([one_way, torn], "did not pass")):
    (t,) = _build([path], validated_by=records)
    assert t["rows"] == [{"max_bytes": 64, "algorithm": "one_shot_ll"}], records
    assert why in t["provenance"]["note"], (why, t["provenance"]["note"])
  (t,) = _build([path], validated_by=[one_way, back, same_device])
  assert t["rows"] == [{"max_bytes": 64, "algorithm": "one_shot_ll128"}]
  assert tune.from_results_command([path], None, tune_tables.DEFAULT_MARGIN, False,
                                   [one_way, back]).endswith(
      f" --store_atomicity={one_way},{back}")


def test_builder_refuses_rows_without_their_fields_or_with_nan_times(tmp_path):
  row = _row("llar.one_shot_ll", 64, 4)
  del row["dtype"]
  with pytest.raises(tune_tables.TuningBuildError, match="lacks dtype"):
    _build([_results(tmp_path, [_row("lax.psum", 64, 20), row])])
  with pytest.raises(tune_tables.TuningBuildError, match="not positive"):
    _build([_results(tmp_path, [_row("lax.psum", 64, 20),
                                _row("llar.one_shot_ll", 64, float("nan"))])])


def _vrow(impl, us, nbytes=64, correct=True, fast=True, algorithm=None):
  return {"impl": impl, "world_size": 2, "bytes_per_rank": nbytes, "dtype": "float32",
          "us_per_call": us, "correct": correct,
          "fast_path": None if impl == "lax.psum" else fast, "algorithm": algorithm}


def test_fastest_takes_only_correct_fast_path_rows():
  from jax_llar.tools.tune.plan import fastest
  rows = [_vrow("lax.psum", 1.0), _vrow("llar.one_shot_ll", 2.0),
          _vrow("llar.two_shot_ll", 1.5, fast=False),
          _vrow("llar.one_shot_sentinel", 1.2, correct=False),
          _vrow("llar.two_shot_ll", 9.0, nbytes=1 << 20)]
  best = fastest(rows)
  assert best[(2, 64, "float32")]["impl"] == "llar.one_shot_ll"
  assert best[(2, 1 << 20, "float32")]["us_per_call"] == 9.0
  assert len(best) == 2


@pytest.mark.parametrize("auto_us,near,slower_ok,fast", [
    (2.05, True, True, True),     # 2.5% above the best: near, 7.8x lax.psum
    (2.2, False, True, True),     # 10% above the best
    (6.0, False, True, False),    # < 3x lax.psum
    (17.0, False, False, False),  # slower than lax.psum
])
def test_verdicts_apply_issue_11s_three_rules(auto_us, near, slower_ok, fast):
  from jax_llar.tools.tune.plan import AUTO, verdicts
  rows = [_vrow("lax.psum", 16.0), _vrow("llar.one_shot_ll", 2.0),
          _vrow(AUTO, auto_us, algorithm="one_shot_ll")]
  (v,) = verdicts(rows)
  assert (v["near_best"], v["not_slower_than_psum"], v["fast_enough"]) == (near, slower_ok,
                                                                           fast)
  assert v["auto_over_best"] == pytest.approx(auto_us / 2.0)
  assert v["auto_algorithm"] == "one_shot_ll" and v["correct"]


def test_verdicts_above_1_mib_ask_no_speedup_and_psum_counts_as_a_choice():
  from jax_llar.tools.tune.plan import AUTO, verdicts
  big = 16 << 20
  rows = [_vrow("lax.psum", 100.0, nbytes=big), _vrow(AUTO, 103.0, nbytes=big, fast=False)]
  (v,) = verdicts(rows)
  assert v["fast_enough"] is None and v["best_impl"] is None
  assert v["near_best"] and not v["not_slower_than_psum"] and v["auto_algorithm"] is None
  rows[0]["correct"] = False
  assert not verdicts(rows)[0]["correct"]
