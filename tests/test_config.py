"""Configuration and the run-time environment, on CPU.

Settings from the environment (``jax_llar.config``); ``jax_llar.status()``
and ``error_reports()`` (no logging or printing, build information); the
extension loader's checks that need no GPU (``jax_llar._ext``: the tested
(jax, NCCL) pairs, the extension's constants against
``jax_llar.algorithms``).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import types

import jax
import pytest

import jax_llar
from jax_llar import _ext, algorithms, config
from jax_llar.config import settings as llar_settings


def _settings_with(monkeypatch, **env):
  """The settings jax_llar would read at import with `env` set."""
  for k, v in env.items():
    monkeypatch.setenv(k, v)
  return config._from_env()  # pylint: disable=protected-access


# --- settings ------------------------------------------------------------------


@pytest.mark.parametrize("raw,expect", [("", False), ("0", False), ("false", False),
                                        ("OFF", False), ("no", False), ("1", True),
                                        ("true", True), ("Yes", True), ("on", True)])
def test_disable_flag_parsing(monkeypatch, raw, expect):
  assert _settings_with(monkeypatch, JAX_LLAR_DISABLE=raw).disabled is expect


@pytest.mark.parametrize("env", [{"JAX_LLAR_DISABLE": "maybe"},
                                 {"JAX_LLAR_MAX_BYTES": "-5"},
                                 {"JAX_LLAR_TIMEOUT_MS": "0"},
                                 {"JAX_LLAR_TIMEOUT_MS": "ten"}])
def test_bad_environment_is_a_clear_error(monkeypatch, env):
  ((var, raw),) = env.items()
  with pytest.raises(ValueError) as e:
    _settings_with(monkeypatch, **env)
  # One line: the prefix, the variable, the value (tests/test_settings_bounds.py
  # has the property test of the parser).
  assert str(e.value).startswith(f"jax_llar settings from the environment: {var}: ")
  assert repr(raw) in str(e.value) and "\n" not in str(e.value)


def test_max_bytes_from_the_environment_is_clipped_to_the_cap(monkeypatch):
  assert _settings_with(monkeypatch, JAX_LLAR_MAX_BYTES="1000").max_bytes == 1000
  assert _settings_with(monkeypatch, JAX_LLAR_MAX_BYTES="0").max_bytes == 0
  big = str(algorithms.LARGEST_MAX_BYTES + 1)
  assert (_settings_with(monkeypatch, JAX_LLAR_MAX_BYTES=big).max_bytes
          == algorithms.LARGEST_MAX_BYTES)


def test_settings_assignment_is_checked():
  s = config.Settings()
  for name, bad in [("timeout_ms", -1), ("timeout_ms", 0), ("max_bytes", -1),
                    ("max_bytes", config.MAX_BYTES_CAP + 1), ("max_bytes", 1.5)]:
    with pytest.raises(ValueError):
      setattr(s, name, bad)
  s.max_bytes = 0
  s.timeout_ms = 5
  assert (s.max_bytes, s.timeout_ms) == (0, 5)
  # The default is the cap: the tuning tables decide up to their own limits.
  assert config.settings.max_bytes == config.DEFAULT_MAX_BYTES == config.MAX_BYTES_CAP
  assert config.MAX_BYTES_CAP == algorithms.LARGEST_MAX_BYTES
  for name, bad in [("tuning_file", None), ("tuning_file", 3), ("tuning_dir", None),
                    ("tuning_dir", b"/tmp"), ("tuning_file", "a\0b")]:
    with pytest.raises(ValueError, match=name):
      setattr(s, name, bad)
  # One rule for every string setting, as from the environment: stripped,
  # and empty (or whitespace only) means the default.
  s.tuning_dir = "/tmp/x"
  s.tuning_dir = " \t"
  assert s.tuning_dir == config.DEFAULT_TUNING_DIR


def test_tuning_settings_from_the_environment(monkeypatch, tmp_path):
  monkeypatch.delenv("JAX_LLAR_TUNING_FILE", raising=False)
  monkeypatch.delenv("JAX_LLAR_TUNING_DIR", raising=False)
  s = config._from_env()  # pylint: disable=protected-access
  assert (s.tuning_file, s.tuning_dir) == ("", config.DEFAULT_TUNING_DIR)
  assert config.DEFAULT_TUNING_DIR == os.path.join("~", ".cache", "jax_llar", "tuning")
  s = _settings_with(monkeypatch, JAX_LLAR_TUNING_FILE=f" {tmp_path}/t.json ",
                     JAX_LLAR_TUNING_DIR=str(tmp_path))
  assert (s.tuning_file, s.tuning_dir) == (f"{tmp_path}/t.json", str(tmp_path))
  s.tuning_dir = tmp_path  # a path object is kept as its string
  assert s.tuning_dir == str(tmp_path)


# --- status ----------------------------------------------------------------------


def test_status_inactive_on_cpu():
  s = jax_llar.status()
  assert s["active"] is False
  assert isinstance(s["reason"], str) and s["reason"]
  assert s["comm_sets"] == [] and s["nccl_runtime"] is None
  assert s["settings"]["max_bytes"] == llar_settings.max_bytes
  assert jax_llar.error_reports() == []


def test_status_neither_logs_nor_prints(monkeypatch, caplog, capfd):
  """Issue 15, item 7: status() on CPU, the first call in a process (the
  extension loader runs), writes nothing to the log, stdout or stderr."""
  monkeypatch.setattr(_ext, "_loaded", False)
  monkeypatch.setattr(_ext, "_module", None)
  monkeypatch.setattr(_ext, "_reason", None)
  caplog.set_level(logging.DEBUG)
  capfd.readouterr()
  s = jax_llar.status()
  jax_llar.status()
  jax_llar.error_reports()
  assert s["active"] is False and s["reason"]
  assert caplog.records == []
  assert capfd.readouterr() == ("", "")


def test_status_build_information_is_consistent():
  """``built: True`` comes with the compiled NCCL version (from the build's
  generated ``jax_llar._build_info``), never with None."""
  s = jax_llar.status()
  info = _ext.build_info()
  assert s["build"] == info
  if info is None:
    assert s["nccl_compiled"] is None
  else:
    assert set(info) == {"nccl_version_code", "cuda_version",
                         "cuda_architectures", "jaxlib_version",
                         "xla_ffi_api_version"}
    assert s["nccl_compiled"] == info["nccl_version_code"] > 0
  if s["built"]:
    assert s["nccl_compiled"] is not None, (
        "the CUDA extension is built but jax_llar/_build_info.py is missing: "
        "rebuild (pip install -e .)")


def test_build_info_absent_is_none(monkeypatch):
  monkeypatch.setattr(_ext.importlib, "import_module", _missing_build_info)
  assert _ext.build_info() is None
  s = jax_llar.status()
  assert (s["build"], s["nccl_compiled"]) == (None, None)


def _missing_build_info(name):
  raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def test_build_info_from_the_generated_module(monkeypatch):
  """What CMake generates (jax_llar/_build_info.py) reaches status()."""
  generated = types.SimpleNamespace(NCCL_VERSION_CODE=22809,
                                    CUDA_VERSION="13.0.88",
                                    CUDA_ARCHITECTURES="90;100")
  real_import = _ext.importlib.import_module
  monkeypatch.setattr(
      _ext.importlib, "import_module",
      lambda name: generated if name == "jax_llar._build_info" else real_import(name))
  want = {"nccl_version_code": 22809, "cuda_version": "13.0.88",
          "cuda_architectures": "90;100", "jaxlib_version": None,
          "xla_ffi_api_version": None}
  assert _ext.build_info() == want
  s = jax_llar.status()
  assert (s["build"], s["nccl_compiled"]) == (want, 22809)


def test_error_reports_load_nothing(monkeypatch):
  monkeypatch.setattr(_ext, "_loaded", False)
  monkeypatch.setattr(_ext, "_module", None)
  assert jax_llar.error_reports() == []
  assert _ext._loaded is False  # pylint: disable=protected-access


# --- the extension's checks --------------------------------------------------------


class _Ext:
  """The attributes of jax_llar._llar that _ext reads."""
  # A faithful extension exports the Python module's ids and limits.
  ALGORITHMS = {a.short_name: int(a) for a in algorithms.Algorithm}
  MAX_BYTES = {a.short_name: n for a, n in algorithms.MAX_BYTES.items()}
  MAX_RANKS = 16
  FUSED_MAX_BYTES = 262144
  FUSED_BLOCK_LINES = 64
  FUSED_MAX_CLUSTER_BLOCKS = 8
  # The signed algorithms in id order, as the extension lists them.
  SIGNED = [a.short_name for a in sorted(algorithms.SIGNED)]
  SIGNATURE_BITS = 16

  def __init__(self, nccl=22809):
    self.nccl = nccl

  def nccl_runtime_version(self):
    return self.nccl

  def nccl_compiled_version(self):
    return 22809

  def error_reports(self):
    return []


def test_constants_match_algorithms():
  assert _ext.constants_mismatch(_Ext()) is None
  for name, bad in [("ALGORITHMS", {"one_shot_ll": 2}),
                    ("ALGORITHMS", {"one_shot_ll": 1, "two_shot": 2}),
                    ("MAX_BYTES", {"one_shot_ll": 131072}),
                    ("MAX_RANKS", 8), ("MAX_RANKS", None),
                    ("FUSED_BLOCK_LINES", 128), ("FUSED_MAX_CLUSTER_BLOCKS", None),
                    ("SIGNED", ["one_shot_ll"]), ("SIGNED", None),
                    ("SIGNATURE_BITS", 32)]:
    ext = _Ext()
    setattr(ext, name, bad)
    message = _ext.constants_mismatch(ext)
    assert message is not None and name in message, (name, bad)
    assert "reinstall" in message


def test_untested_versions_message():
  assert _ext.TESTED_VERSIONS == {("0.11.2", 22809)}
  assert _ext.untested_versions_message("0.11.2", 22809) is None
  for jax_version, nccl in [("0.12.0.1", 22809), ("0.11.2", 23203),
                            ("0.12.0.1", 23203)]:
    m = _ext.untested_versions_message(jax_version, nccl)
    assert f"jax {jax_version}" in m and _ext.nccl_version_string(nccl) in m
    assert "tested: jax 0.11.2 with NCCL 2.28.9" in m
  assert _ext.nccl_version_string(22809) == "2.28.9"
  assert _ext.nccl_version_string(23203) == "2.32.3"


def test_untested_pair_logged_once_on_load(monkeypatch, caplog):
  caplog.set_level(logging.DEBUG, logger="jax_llar")
  monkeypatch.setattr(_ext, "_loaded", True)
  monkeypatch.setattr(_ext, "_module", _Ext(nccl=23203))
  assert _ext.load(quiet=True) is _ext._module  # pylint: disable=protected-access
  jax_llar.status()
  assert caplog.records == []
  for _ in range(3):
    _ext.load()
  (r,) = caplog.records
  assert r.levelno == logging.WARNING and r.name == "jax_llar"
  assert "2.32.3" in r.getMessage() and jax.__version__ in r.getMessage()
  assert "jax 0.11.2 with NCCL 2.28.9" in r.getMessage()
  # A tested pair: nothing.
  caplog.clear()
  jax_llar.clear_dispatch_log()
  monkeypatch.setattr(_ext, "TESTED_VERSIONS",
                      frozenset({(jax.__version__, 23203)}))
  _ext.load()
  assert caplog.records == []


def test_status_versions_are_readable():
  """status() gives versions as strings, and whether the (jax, NCCL) pair is
  one the GPU suite ran with; on CPU the runtime NCCL is unknown."""
  s = jax_llar.status()
  v = s["versions"]
  assert v["jax"] == jax.__version__
  assert v["nccl_runtime"] is None and v["tested_pair"] is None
  if s["nccl_compiled"] is not None:
    assert v["nccl_compiled"] == _ext.nccl_version_string(s["nccl_compiled"])
  assert _ext.nccl_version_string(22809) == "2.28.9"


def test_algorithm_setting_from_the_environment():
  code = ("from jax_llar.config import settings; "
          "print(settings.algorithm, repr(settings.forced()))")
  for value, want in (("", "auto None"), ("auto", "auto None"),
                      ("one_shot_ll", "one_shot_ll Algorithm.ONE_SHOT_LL")):
    env = dict(os.environ, JAX_LLAR_ALGORITHM=value)
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                         capture_output=True, text=True).stdout.strip()
    assert out == want, (value, out)
  env = dict(os.environ, JAX_LLAR_ALGORITHM="two_shot_maybe")
  p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                     text=True)
  assert p.returncode != 0 and "algorithm must be one of" in p.stderr


def test_a_settings_change_relowers_jitted_functions():
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax.sharding import Mesh, PartitionSpec as P  # pylint: disable=g-import-not-at-top
  mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
  traces = []

  def body(v):
    traces.append(1)
    return jax_llar.psum(v, "x")

  f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P()))
  x = np.ones(4, np.float32)
  f(x)
  jax_llar.clear_dispatch_log()
  try:
    llar_settings.disabled = True
    f(x)
    assert [d.reason for d in jax_llar.dispatch_log()] == ["disabled"]
  finally:
    llar_settings.disabled = False
  assert len(traces) == 2


def test_settings_reject_values_of_the_wrong_kind():
  import numpy as np  # pylint: disable=g-import-not-at-top
  for name, bad in (("disabled", "false"), ("timeout_ms", True), ("max_bytes", 1.5)):
    with pytest.raises(ValueError, match=name):
      setattr(llar_settings, name, bad)
  old = llar_settings.max_bytes
  try:
    llar_settings.max_bytes = np.int64(1024)
    assert llar_settings.max_bytes == 1024 and type(llar_settings.max_bytes) is int
  finally:
    llar_settings.max_bytes = old


@pytest.mark.parametrize("built,runtime,ok", [
    ((0, 5), (0, 5), True),
    ((0, 4), (0, 5), True),    # handlers built against an older minor version
    ((0, 5), (0, 4), False),   # built against a newer jaxlib than runs
    ((0, 5), (1, 0), False),   # another major version: ABI changed
    (None, (0, 5), True),      # a build without the record is not checked
    ((0, 5), None, True),      # headers of the runtime not readable
])
def test_ffi_api_mismatch(built, runtime, ok):
  why = _ext.ffi_api_mismatch(built, runtime)
  if ok:
    assert why is None
  else:
    assert "%d.%d" % built in why and "%d.%d" % runtime in why
    assert "rebuild" in why


def test_runtime_ffi_api_version_reads_jaxlib_headers():
  """The running jaxlib's headers give a version; the parser needs both lines."""
  version = _ext.runtime_ffi_api_version()
  assert version is not None and all(isinstance(v, int) for v in version)
  assert _ext._parse_ffi_api_version(
      "#define XLA_FFI_API_MAJOR 0\n#define XLA_FFI_API_MINOR 7\n") == (0, 7)
  assert _ext._parse_ffi_api_version("#define XLA_FFI_API_MAJOR 0\n") is None


def test_built_ffi_api_version_from_the_generated_module(monkeypatch):
  generated = types.SimpleNamespace(XLA_FFI_API_VERSION=(0, 4))
  real_import = _ext.importlib.import_module
  monkeypatch.setattr(
      _ext.importlib, "import_module",
      lambda name: generated if name == "jax_llar._build_info" else real_import(name))
  assert _ext.built_ffi_api_version() == (0, 4)
  monkeypatch.setattr(_ext.importlib, "import_module", _missing_build_info)
  assert _ext.built_ffi_api_version() is None
