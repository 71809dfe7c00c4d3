"""Tuning tables and result files that are not what they should be (issue
23, item C), on CPU: one clear error, never a traceback, a hang or a
RecursionError.

Deeply nested JSON is refused before parsing (``jsonfile.MAX_JSON_DEPTH``, a
scan that does not recurse); a directory, a FIFO or another file that is not
regular is said to be one and never opened; result files whose members have
the wrong JSON types are refused by ``tune_tables.build_tables`` with
``TuningBuildError``, and ``python -m jax_llar.tools.tune --from_results``
prints one line and exits with 1. Property tests: whatever JSON a table file
or a result file holds, reading it raises nothing but ``TuningTableError`` /
``TuningBuildError``.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile
import threading

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings as hyp_settings, strategies as st
from jax.sharding import PartitionSpec as P

import jax_llar
from jax_llar import jsonfile, table_lookup, tuning
from jax_llar.tools.tune import tables as tune_tables
from jax_llar.config import settings as llar_settings

from cpu_helpers import mesh_of, user_env

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROVENANCE = {k: None for k in tuning.PROVENANCE_KEYS}
HYP = hyp_settings(max_examples=150, deadline=None,
                   suppress_health_check=[HealthCheck.function_scoped_fixture])
DEEP = "[" * 200_000


def _table(**extra):
  d = {"format": tuning.FORMAT, "architecture": "sm_90", "ranks": 2,
       "rows": [{"max_bytes": 1024, "algorithm": "one_shot_ll"}],
       "provenance": dict(PROVENANCE, command="test")}
  d.update(extra)
  return d


def _row(impl, nbytes, us, dtype="float32", world=2, **kw):
  r = {"impl": impl, "dtype": dtype, "bytes_per_rank": nbytes, "world_size": world,
       "us_per_call": us, "correct": True, "fast_path": impl != "lax.psum"}
  r.update(kw)
  return r


GOOD_RESULTS = {"env": {"compute_capabilities": ["9.0"], "devices": ["H200", "H200"]},
                "rows": [_row("lax.psum", 64, 20), _row("llar.one_shot_ll", 64, 4)]}


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
  monkeypatch.setattr(llar_settings, "tuning_dir", str(tmp_path / "user"))
  monkeypatch.setattr(llar_settings, "tuning_file", "")
  table_lookup.clear_cache()
  yield
  table_lookup.clear_cache()


def _fifo(path: pathlib.Path) -> pathlib.Path:
  os.mkfifo(path)
  return path


def _within(seconds, fn, fifo=None):
  """fn() in a thread, which must end within `seconds` (a FIFO it blocks
  on is opened for writing, to let it go, and the test fails)."""
  out = {}

  def run():
    try:
      out["value"] = fn()
    except Exception as e:  # pylint: disable=broad-except
      out["error"] = e

  t = threading.Thread(target=run, daemon=True)
  t.start()
  t.join(seconds)
  if t.is_alive():
    if fifo is not None:
      os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    t.join(5)
    pytest.fail(f"blocked for more than {seconds} s")
  return out


# --- the nesting bound -------------------------------------------------------------------


def test_deep_nesting_is_a_tuning_table_error_not_a_recursion(tmp_path):
  path = tmp_path / "deep.json"
  path.write_text(DEEP)
  with pytest.raises(tuning.TuningTableError) as e:
    tuning.load(path)
  assert str(e.value) == (f"jax_llar tuning table {path}: is not JSON that jax_llar reads: "
                          f"its arrays and objects nest deeper than {jsonfile.MAX_JSON_DEPTH} "
                          "levels")
  # Objects count as arrays do; brackets inside strings do not count.
  path.write_text('{"a": ' * 100 + "1" + "}" * 100)
  with pytest.raises(tuning.TuningTableError, match="nest deeper than"):
    tuning.load(path)
  note = "[{" * 5000 + '\\"]' + "\\\\"
  path.write_text(json.dumps(_table(provenance=dict(PROVENANCE, note=note))))
  assert tuning.load(path).provenance["note"] == note
  # At the bound: read, and refused for what it is.
  n = jsonfile.MAX_JSON_DEPTH
  path.write_text("[" * n + "]" * n)
  with pytest.raises(tuning.TuningTableError, match="not a JSON object"):
    tuning.load(path)
  path.write_text("[" * (n + 1) + "]" * (n + 1))
  with pytest.raises(tuning.TuningTableError, match="nest deeper"):
    tuning.load(path)
  # Broken text: still "is not JSON", whatever it holds.
  for text in ('{"a": "unterminated [[[[', '{"a": "x\\', "]]]]}}", ""):
    path.write_text(text)
    with pytest.raises(tuning.TuningTableError, match="is not JSON"):
      tuning.load(path)


def test_a_deep_tuning_file_fails_the_lowering_with_its_error(tmp_path, monkeypatch):
  path = tmp_path / "deep.json"
  path.write_text(DEEP)
  monkeypatch.setattr(llar_settings, "tuning_file", str(path))
  mesh = mesh_of((2,), ("x",))
  f = jax.jit(jax.shard_map(lambda v: jax_llar.psum(v, "x"), mesh=mesh, in_specs=P("x"),
                            out_specs=P()))
  with pytest.raises(tuning.TuningTableError, match="nest deeper than"):
    f(np.ones(4, np.float32))


def test_a_deep_tuning_file_from_the_environment_fails_with_one_message(tmp_path):
  path = tmp_path / "deep.json"
  path.write_text(DEEP)
  code = ("import jax, numpy as np, jax_llar\n"
          "from jax.sharding import Mesh, PartitionSpec as P\n"
          "mesh = Mesh(np.array(jax.devices()[:2]), ('x',))\n"
          "f = jax.jit(jax.shard_map(lambda v: jax_llar.psum(v, 'x'), mesh=mesh,"
          " in_specs=P('x'), out_specs=P()))\n"
          "try:\n"
          "  f(np.ones(4, np.float32))\n"
          "except jax_llar.tuning.TuningTableError as e:\n"
          "  print('refused:', e)\n")
  env = dict(user_env(), JAX_PLATFORMS="cpu", JAX_LLAR_TUNING_FILE=str(path),
             XLA_FLAGS="--xla_force_host_platform_device_count=2")
  p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                     timeout=120)
  assert p.returncode == 0, p.stderr
  assert p.stdout.startswith(f"refused: jax_llar tuning table {path}: is not JSON"), p.stdout
  assert "RecursionError" not in p.stdout + p.stderr


# --- not a regular file ----------------------------------------------------------------


def test_a_directory_or_a_fifo_is_said_to_be_one_and_never_opened(tmp_path, monkeypatch):
  folder = tmp_path / "folder.json"
  folder.mkdir()
  fifo = _fifo(tmp_path / "fifo.json")
  for path, what in ((folder, "is a directory, not a file"),
                     (fifo, "is not a regular file (a FIFO, a named pipe)"),
                     (tmp_path / "missing.json", "does not exist"),
                     (tmp_path / "missing" / "t.json", "does not exist")):
    out = _within(10, lambda p=path: tuning.load(p), fifo)
    assert isinstance(out.get("error"), tuning.TuningTableError), out
    assert str(out["error"]) == f"jax_llar tuning table {path}: {what}"
    # As the tuning file setting: the same, naming the setting.
    monkeypatch.setattr(llar_settings, "tuning_file", str(path))
    out = _within(10, lambda: table_lookup.lookup("sm_90", 2), fifo)
    assert isinstance(out.get("error"), tuning.TuningTableError), out
    assert str(out["error"]).startswith(f"jax_llar tuning table {path}: {what} ("), out
    assert "JAX_LLAR_TUNING_FILE" in str(out["error"])
  # A regular file below a name that is one: "does not exist".
  regular = tmp_path / "plain"
  regular.write_text("{}")
  with pytest.raises(tuning.TuningTableError, match="does not exist"):
    tuning.load(regular / "t.json")


def test_a_directory_or_fifo_in_the_tuning_directory_is_reported(tmp_path):
  user = pathlib.Path(llar_settings.tuning_dir)
  user.mkdir(parents=True)
  (user / "sm_90-2ranks.json").mkdir()
  _fifo(user / "sm_90-4ranks.json")
  with pytest.raises(tuning.TuningTableError, match="is a directory") as e:
    table_lookup.lookup("sm_90", 2)
  assert "JAX_LLAR_TUNING_DIR" in str(e.value)
  out = _within(10, lambda: table_lookup.lookup("sm_90", 4), user / "sm_90-4ranks.json")
  assert "a FIFO" in str(out.get("error")), out
  # No file there at all: the shipped table, as before.
  assert table_lookup.lookup("sm_80", 2).origin == "default"


def test_a_file_replaced_by_a_fifo_after_the_check_does_not_block(tmp_path, monkeypatch):
  fifo = _fifo(tmp_path / "fifo.json")
  monkeypatch.setattr(jsonfile, "problem", lambda path: None)  # the check passed
  out = _within(10, lambda: tuning.load(fifo), fifo)
  assert "a FIFO" in str(out.get("error")), out


# --- result files --------------------------------------------------------------------


def _results_file(directory, content, name="r.json") -> str:
  path = os.path.join(directory, name)
  with open(path, "w", encoding="utf-8") as f:
    f.write(content if isinstance(content, str) else json.dumps(content))
  return path


BAD_RESULTS = [
    (DEEP, "nest deeper than"),
    ([GOOD_RESULTS], "is not a result file: a JSON object, got an array"),
    (None, "is not a result file: a JSON object, got null"),
    ("\"text\"", "is not a result file: a JSON object, got a string"),
    (dict(GOOD_RESULTS, rows=[1, 2]), "row 1 must be a JSON object, got a number"),
    (dict(GOOD_RESULTS, rows={"a": 1}), "rows must be a JSON array, got an object"),
    (dict(GOOD_RESULTS, env="H200"), "env must be a JSON object, got a string"),
    (dict(GOOD_RESULTS, env={"compute_capabilities": "9.0"}),
     "env.compute_capabilities must be a JSON array, got a string"),
    (dict(GOOD_RESULTS, env={"devices": 2}), "env.devices must be a JSON array"),
    (dict(GOOD_RESULTS, architecture=90), "architecture must be a string"),
    (dict(GOOD_RESULTS, rows=[_row("lax.psum", 64, None)]),
     "row's us_per_call must be a number, got null"),
    (dict(GOOD_RESULTS, rows=[_row("lax.psum", 64, "fast")]), "us_per_call must be a number"),
    (dict(GOOD_RESULTS, rows=[_row("lax.psum", 64, 1, dtype=["f32"])]),
     "dtype must be a string, got an array"),
    (dict(GOOD_RESULTS, rows=[_row("lax.psum", 64.5, 1)]),
     "bytes_per_rank must be a positive integer"),
    (dict(GOOD_RESULTS, rows=[_row("lax.psum", True, 1)]),
     "bytes_per_rank must be a positive integer, got a boolean"),
    (dict(GOOD_RESULTS, rows=[_row("lax.psum", 64, 1, world=1)]),
     "world_size must be an integer in 2..16"),
    (dict(GOOD_RESULTS, rows=[_row("llar.one_shot_ll", 64, 1, algorithm=[1])]),
     "names no algorithm"),
]


@pytest.mark.parametrize("content,message", BAD_RESULTS,
                         ids=[m.split(",")[0][:40] for _, m in BAD_RESULTS])
def test_a_bad_result_file_is_a_build_error_naming_it(tmp_path, content, message):
  path = _results_file(tmp_path, content if content is not None else "null")
  with pytest.raises(tune_tables.TuningBuildError) as e:
    tune_tables.build_tables([path], command="test")
  assert str(e.value).startswith(f"{path}: "), str(e.value)
  assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_result_files_that_are_not_regular_files(tmp_path):
  folder = tmp_path / "folder"
  folder.mkdir()
  fifo = _fifo(tmp_path / "fifo")
  for path, what in ((folder, "is a directory, not a file"),
                     (fifo, "is not a regular file (a FIFO, a named pipe)"),
                     (tmp_path / "missing.json", "does not exist")):
    out = _within(10, lambda p=path: tune_tables.build_tables([str(p)], command="test"), fifo)
    assert isinstance(out.get("error"), tune_tables.TuningBuildError), out
    assert str(out["error"]) == f"{path}: {what}"
    out = _within(10, lambda p=path: tune_tables.store_atomicity_validation([str(p)]), fifo)
    assert str(out.get("error")) == f"{path}: {what}", out


def test_the_good_results_build_and_record_their_digest(tmp_path):
  import hashlib  # pylint: disable=g-import-not-at-top
  path = _results_file(tmp_path, GOOD_RESULTS)
  (t,) = tune_tables.build_tables([path], command="test")
  assert t["rows"] == [{"max_bytes": 64, "algorithm": "one_shot_ll"}]
  digest = hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()
  assert t["provenance"]["results_sha256"] == [digest]


@pytest.mark.parametrize("record,why", [
    ([], "a JSON object, got an array"),
    ({"level": "store_atomicity", "passed": True, "complete": True, "torn_lines": 0,
      "bad_words": 0, "over_nvlink": True, "settings": "x"}, "does not name its writer"),
    ({"level": "store_atomicity", "passed": True, "complete": True, "torn_lines": 0,
      "bad_words": 0, "over_nvlink": True,
      "settings": {"writer_device": [0], "reader_device": {}}}, "does not name its writer"),
])
def test_store_atomicity_records_of_the_wrong_shape(tmp_path, record, why):
  path = _results_file(tmp_path, record)
  try:
    reason = tune_tables.store_atomicity_validation([path])
  except tune_tables.TuningBuildError as e:
    reason = str(e)
  assert why in reason and path in reason


# --- the tune command --------------------------------------------------------------------


def test_tune_from_results_fails_with_one_line_for_each_bad_file(tmp_path):
  folder = tmp_path / "folder"
  folder.mkdir()
  cases = {
      "deep": (_results_file(tmp_path, DEEP, "deep.json"), "nest deeper than"),
      "list": (_results_file(tmp_path, [GOOD_RESULTS], "list.json"), "got an array"),
      "null": (_results_file(tmp_path, "null", "null.json"), "got null"),
      "rows": (_results_file(tmp_path, dict(GOOD_RESULTS, rows=["x"]), "rows.json"),
               "row 1 must be a JSON object"),
      "env": (_results_file(tmp_path, dict(GOOD_RESULTS, env="x"), "env.json"),
              "env must be a JSON object"),
      "folder": (str(folder), "is a directory, not a file"),
      "fifo": (str(_fifo(tmp_path / "fifo.json")), "is not a regular file (a FIFO"),
      "empty": ("", "--from_results must name result files"),
  }
  procs = {
      name: subprocess.Popen(
          [sys.executable, "-m", "jax_llar.tools.tune", f"--from_results={path}",
           f"--out={tmp_path / f'out-{name}'}"],
          cwd=ROOT, env=dict(user_env(), JAX_PLATFORMS="cpu"), stdout=subprocess.PIPE,
          stderr=subprocess.PIPE, text=True)
      for name, (path, _) in cases.items()}
  try:
    for name, p in procs.items():
      out, err = p.communicate(timeout=180)
      path, message = cases[name]
      assert p.returncode == 1, (name, out, err)
      assert "Traceback" not in err and "Error" not in err, (name, err)
      lines = out.splitlines()
      assert len(lines) == 1 and message in lines[0], (name, out)
      if name != "empty":
        assert lines[0].startswith(f"jax_llar.tools.tune: --from_results: no table written: {path}: "), out
  finally:
    for p in procs.values():
      if p.poll() is None:
        p.kill()
  # Each process its own --out: eight processes probing one new folder at
  # once race (one's probe file can stop another's removal of the folder it
  # made), which is not what this test is about.
  assert not any((tmp_path / f"out-{name}").exists() for name in cases)


# --- properties: nothing but the documented errors -----------------------------------------

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8)
    | st.sampled_from(["lax.psum", "llar.one_shot_ll", "llar.two_shot_ll", "float32",
                       "sm_90", "9.0", "one_shot_ll"]),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=20)


def _maybe(strategy):
  return st.one_of(strategy, _JSON)


_ROW = st.fixed_dictionaries(
    {"impl": _maybe(st.sampled_from(["lax.psum", "llar.one_shot_ll", "llar.two_shot_ll",
                                     "llar.one_shot_ll128", "llar.copy"])),
     "dtype": _maybe(st.sampled_from(["float32", "bfloat16"])),
     "bytes_per_rank": _maybe(st.sampled_from([8, 64, 1024, 262144, 1 << 22, 1 << 30])),
     "world_size": _maybe(st.sampled_from([2, 4, 17])),
     "us_per_call": _maybe(st.floats(0, 100)),
     "correct": _maybe(st.just(True))},
    optional={"fast_path": _maybe(st.booleans()),
              "algorithm": _maybe(st.sampled_from(["one_shot_ll", None, "two_shot_ll"]))})

_RESULTS = st.one_of(
    _JSON,
    st.fixed_dictionaries(
        {},
        optional={"env": _maybe(st.fixed_dictionaries(
                      {}, optional={"compute_capabilities": _maybe(st.just(["9.0"])),
                                    "devices": _maybe(st.just(["H200"])),
                                    "git_commit": _JSON, "nccl_runtime": _JSON})),
                  "rows": _maybe(st.lists(_maybe(_ROW), max_size=6)),
                  "architecture": _maybe(st.just("sm_90"))}))


@HYP
@given(results=st.lists(_RESULTS, min_size=1, max_size=2),
       architecture=st.sampled_from([None, "sm_90"]))
def test_build_tables_raises_nothing_but_its_build_error(results, architecture):
  with tempfile.TemporaryDirectory() as d:
    paths = [_results_file(d, json.dumps(r), f"r{i}.json") for i, r in enumerate(results)]
    try:
      tables = tune_tables.build_tables(paths, command="test", architecture=architecture)
    except tune_tables.TuningBuildError as e:
      assert "\n" not in str(e)
      return
  for t in tables:
    tuning.from_dict(t, "(built)")
    json.dumps(t)


_TABLE = st.one_of(_JSON, st.fixed_dictionaries(
    {"format": _maybe(st.just(tuning.FORMAT)), "architecture": _maybe(st.just("sm_90")),
     "ranks": _maybe(st.sampled_from([2, 4])),
     "rows": _maybe(st.lists(_maybe(st.fixed_dictionaries(
         {"max_bytes": _maybe(st.sampled_from([64, 1024, 1 << 22])),
          "algorithm": _maybe(st.sampled_from(["one_shot_ll", "lax.psum", "two_shot_ll"]))})),
         max_size=3)),
     "provenance": _maybe(st.just(PROVENANCE))}))


@HYP
@given(data=_TABLE)
def test_reading_a_table_raises_nothing_but_its_table_error(data):
  with tempfile.TemporaryDirectory() as d:
    path = _results_file(d, json.dumps(data), "t.json")
    try:
      table = tuning.load(path)
    except tuning.TuningTableError as e:
      assert str(e).startswith(f"jax_llar tuning table {path}: ")
      return
  assert tuning.from_dict(tuning.to_dict(table), path) == table
