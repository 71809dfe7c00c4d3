"""Settings are bounded by what they reach, and checked alike from Python and
from the environment (issue 23, items A and B), on CPU.

A: every value a numeric setting accepts fits each native parameter it
reaches (``native_bounds.NATIVE_PARAMETERS``, whose C++ types are checked here
against ffi/src/module.cc, registry.h and args.h), and a failure of creating
a communicator set, whatever its kind, is a logged fallback to lax.psum.
B: unknown settings raise AttributeError; string settings are stripped and
empty means unset from Python and from the environment; every environment
error carries ``config.ENV_PREFIX``; whitespace only means unset for every
variable; integers are ASCII digits only; and a property test over the
environment parser.
"""

from __future__ import annotations

import logging
import os
import pathlib
import re
import socket
import subprocess
import sys
from unittest import mock

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings as hyp_settings, strategies as st
from jax._src.sharding_impls import SPMDAxisContext
from jax.sharding import Mesh, PartitionSpec as P

import jax_llar
from jax_llar import _ext, comm, config, dispatch, native_bounds
from jax_llar.algorithms import Algorithm
from jax_llar.config import settings as llar_settings

from cpu_helpers import mesh_of, user_env

ROOT = pathlib.Path(__file__).resolve().parent.parent
NUMERIC = ("timeout_ms", "max_bytes")
FIELDS = ("disabled", "timeout_ms", "max_bytes", "algorithm", "tuning_file", "tuning_dir",
          "signatures")
VARIABLES = {"disabled": "JAX_LLAR_DISABLE", "timeout_ms": "JAX_LLAR_TIMEOUT_MS",
             "max_bytes": "JAX_LLAR_MAX_BYTES", "algorithm": "JAX_LLAR_ALGORITHM",
             "tuning_file": "JAX_LLAR_TUNING_FILE", "tuning_dir": "JAX_LLAR_TUNING_DIR",
             "signatures": "JAX_LLAR_SIGNATURES"}
DEFAULTS = {"disabled": False, "timeout_ms": 30_000, "max_bytes": config.DEFAULT_MAX_BYTES,
            "algorithm": "auto", "tuning_file": "", "tuning_dir": config.DEFAULT_TUNING_DIR,
            "signatures": True}
NAMES = ["auto"] + [a.short_name for a in Algorithm]
HYP = hyp_settings(max_examples=150, deadline=None,
                   suppress_health_check=[HealthCheck.function_scoped_fixture])


def _clean_environment():
  """os.environ without any JAX_LLAR_* setting variable (mock.patch.dict
  restores it)."""
  return {k: v for k, v in os.environ.items() if k not in VARIABLES.values()}


def _from_env(**env):
  with mock.patch.dict(os.environ, _clean_environment(), clear=True):
    os.environ.update(env)
    return config._from_env()  # pylint: disable=protected-access


# --- A: the native ranges ----------------------------------------------------------


def _binding_parameters(source: str, name: str) -> dict[str, str]:
  """Parameter name -> C++ type of the lambda bound as `name` in module.cc."""
  m = re.search(r'm\.def\(\s*"' + re.escape(name) + r'",\s*\[\]\((.*?)\)\s*\{', source, re.S)
  assert m, name
  params, depth, part = {}, 0, ""
  for c in " ".join(m.group(1).split()) + ",":
    depth += {"<": 1, ">": -1}.get(c, 0)
    if c == "," and depth == 0:
      ctype, pname = part.strip().rsplit(" ", 1)
      params[pname] = ctype
      part = ""
    else:
      part += c
  return params


def test_the_native_table_states_the_cpp_types():
  """Each NATIVE_PARAMETERS entry names a parameter of that C++ type: the
  bindings' lambdas in module.cc, the registry functions they forward to
  (registry.h), and AllReduceArgs' field (args.h)."""
  module = (ROOT / "ffi/src/module.cc").read_text()
  registry = " ".join((ROOT / "ffi/src/registry.h").read_text().split())
  args_h = (ROOT / "ffi/include/llar/args.h").read_text()
  forwards = {"create_comm_set": "CreateCommSet",
              "create_comm_set_of_ranks": "CreateCommSetOfRanks"}
  checked = 0
  for p in native_bounds.NATIVE_PARAMETERS:
    assert p.ctype in native_bounds.CPP_INTEGER_RANGES, p
    assert p.setting in FIELDS and p.scale >= 1, p
    if p.source == "ffi/src/module.cc":
      assert _binding_parameters(module, p.function)[p.parameter] == p.ctype, p
      decl = re.search(rf"\b{forwards[p.function]}\((.*?)\);", registry)
      assert decl and f"{p.ctype} {p.parameter}" in decl.group(1), (p, decl)
      checked += 1
    elif p.source == "ffi/include/llar/args.h":
      struct = re.search(rf"struct {p.function} \{{(.*?)\n\}};", args_h, re.S)
      assert struct and re.search(rf"^\s*{p.ctype} {p.parameter};", struct.group(1), re.M), p
      checked += 1
    else:
      assert p.source == "jaxlib", p  # checked live below
  assert checked >= 3
  # Every use of a setting's value with a native parameter is in the table.
  assert {p.setting for p in native_bounds.NATIVE_PARAMETERS} == set(NUMERIC)


def test_the_native_ranges():
  assert native_bounds.CPP_INTEGER_RANGES["uint64_t"] == (0, 2**64 - 1)
  assert native_bounds.CPP_INTEGER_RANGES["int64_t"] == (-2**63, 2**63 - 1)
  assert config.TIMEOUT_MS_MAX == (2**64 - 1) // 1_000_000 == 18_446_744_073_709
  assert native_bounds.native_range("timeout_ms") == (0, config.TIMEOUT_MS_MAX)
  assert native_bounds.native_range("max_bytes") == (0, 2**32 - 1)
  with pytest.raises(KeyError):
    native_bounds.native_range("algorithm")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def test_jaxlibs_key_value_get_takes_the_largest_bootstrap_bound():
  """The jaxlib entry (int64_t timeout_in_ms), checked on the real binding:
  twice TIMEOUT_MS_MAX (bootstrap_timeout_ms) is taken, 2**63 refused."""
  from jax._src.lib import _jax  # pylint: disable=g-import-not-at-top
  (entry,) = [p for p in native_bounds.NATIVE_PARAMETERS if p.source == "jaxlib"]
  lo, hi = native_bounds.CPP_INTEGER_RANGES[entry.ctype]
  address = f"localhost:{_free_port()}"
  service = _jax.get_distributed_runtime_service(address, 1)
  client = _jax.get_distributed_runtime_client(address, 0)
  try:
    client.connect()
    client.key_value_set("jax_llar_test/k", "v")
    assert client.blocking_key_value_get("jax_llar_test/k",
                                         entry.scale * config.TIMEOUT_MS_MAX) == "v"
    assert client.blocking_key_value_get("jax_llar_test/k", hi) == "v"
    with pytest.raises(TypeError, match="incompatible function arguments"):
      client.blocking_key_value_get("jax_llar_test/k", hi + 1)
  finally:
    client.shutdown()
    service.shutdown()
  assert lo < 0


def _reaches_natively(name: str, value: int) -> bool:
  """Whether every native parameter `name` reaches holds `value`."""
  for p in native_bounds.NATIVE_PARAMETERS:
    if p.setting == name:
      lo, hi = native_bounds.CPP_INTEGER_RANGES[p.ctype]
      if not lo <= value * p.scale <= hi:
        return False
  return True


_INTS = st.one_of(st.integers(), st.integers(min_value=-2**80, max_value=2**80),
                  st.sampled_from([0, 1, 2**31, 2**32, 2**63, 2**64, 10**13, 10**20,
                                   config.TIMEOUT_MS_MAX, config.TIMEOUT_MS_MAX + 1,
                                   config.MAX_BYTES_CAP, config.MAX_BYTES_CAP + 1]))


@HYP
@given(name=st.sampled_from(NUMERIC), value=_INTS)
@example(name="timeout_ms", value=10**20)  # issue 23, item A
@example(name="timeout_ms", value=10**13)
def test_every_value_a_numeric_setting_accepts_fits_the_native_side(name, value):
  s = config.Settings()
  try:
    setattr(s, name, value)
  except ValueError as e:
    assert name in str(e)
    assert getattr(s, name) == DEFAULTS[name]
    return
  assert getattr(s, name) == value
  assert _reaches_natively(name, value), (name, value)
  if name == "timeout_ms":  # what comm.get_or_create passes
    assert 0 < value * 1_000_000 < 2**64


@HYP
@given(name=st.sampled_from(NUMERIC),
       raw=st.one_of(st.from_regex(r"\A\s*[0-9]{1,30}\s*\Z"), st.text(max_size=30)))
@example(name="timeout_ms", raw=str(10**20))
@example(name="timeout_ms", raw="9" * 5000)  # longer than int() takes
@example(name="max_bytes", raw="9" * 5000)
def test_every_value_the_environment_gives_fits_the_native_side(name, raw):
  if "\0" in raw or any(0xD800 <= ord(c) <= 0xDFFF for c in raw):
    return  # no environment holds these
  try:
    s = _from_env(**{VARIABLES[name]: raw})
  except ValueError as e:
    assert str(e).startswith(config.ENV_PREFIX + VARIABLES[name]), str(e)
    return
  assert _reaches_natively(name, getattr(s, name))


def test_huge_timeouts_are_refused_where_they_are_set():
  s = config.Settings()
  for bad in (10**20, config.TIMEOUT_MS_MAX + 1, 2**64):
    with pytest.raises(ValueError, match=r"timeout_ms must be an int in 1\.\.18446744073709"):
      s.timeout_ms = bad
  s.timeout_ms = config.TIMEOUT_MS_MAX  # the largest: its nanoseconds fit a uint64_t
  assert s.timeout_ms * 1_000_000 <= 2**64 - 1
  for raw in (str(10**20), str(config.TIMEOUT_MS_MAX + 1), "9" * 5000):
    with pytest.raises(ValueError) as e:
      _from_env(JAX_LLAR_TIMEOUT_MS=raw)
    message = str(e.value)
    assert message.startswith(f"{config.ENV_PREFIX}JAX_LLAR_TIMEOUT_MS: timeout_ms must be "
                              "an int in 1..18446744073709"), message
    assert len(message) < 300  # the value cut short, not 5000 digits
  assert _from_env(JAX_LLAR_TIMEOUT_MS=str(config.TIMEOUT_MS_MAX)).timeout_ms == (
      config.TIMEOUT_MS_MAX)
  # max_bytes from the environment is clipped to the cap (documented), even
  # past what int() reads.
  assert _from_env(JAX_LLAR_MAX_BYTES="9" * 5000).max_bytes == config.MAX_BYTES_CAP


# --- A: a failed communicator creation is a fallback --------------------------------


class _Gpu:
  """What decide() reads of a jax.Device."""
  platform = "gpu"

  def __init__(self, i):
    self.id = self.local_hardware_id = i
    self.process_index = 0

  def __repr__(self):
    return f"_Gpu({self.id})"


class _Native:
  """jax_llar._llar as comm calls it, with nanobind's argument check: an
  int outside the C++ parameter's type is a TypeError."""
  ALGORITHMS = {"one_shot_ll": 1}
  MAX_RANKS = 16

  def __init__(self, create_error=None, region_error=None):
    self.create_error, self.region_error = create_error, region_error
    self.created = []

  def create_comm_set(self, groups, timeout_ns):
    lo, hi = native_bounds.CPP_INTEGER_RANGES["uint64_t"]
    if not lo <= timeout_ns <= hi:
      raise TypeError("create_comm_set(): incompatible function arguments. The following "
                      "argument types are supported:\n    1. create_comm_set(groups: "
                      "collections.abc.Sequence[...], timeout_ns: int) -> int\n")
    if self.create_error is not None:
      raise self.create_error
    self.created.append(timeout_ns)
    return 7

  def comm_key(self, comm_id):
    return 99

  def ensure_region(self, comm_id, algorithm):
    if self.region_error is not None:
      raise self.region_error

  def regions(self, comm_id):
    return []

  def nccl_runtime_version(self):
    return 22809

  def error_reports(self):
    return []


@pytest.fixture
def native(monkeypatch):
  """Installs a `_Native` (returned factory) as the loaded extension, with
  jax_llar.comm's memory of sets and failures empty."""

  def install(**kw):
    ext = _Native(**kw)
    monkeypatch.setattr(_ext, "_loaded", True)
    monkeypatch.setattr(_ext, "_module", ext)
    monkeypatch.setattr(_ext, "_reason", None)
    monkeypatch.setattr(comm, "_sets", {})
    monkeypatch.setattr(comm, "_region_failures", {})
    return ext

  monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")  # comm sets it; restored after
  return install


def _gpu_decide():
  ctx = SPMDAxisContext(Mesh(np.array([_Gpu(i) for i in range(4)]).reshape(2, 2), ("a", "b")))
  return dispatch.decide(ctx, jax.core.ShapedArray((16,), np.dtype(np.float32)), ("b",),
                         platform="cuda")


def test_the_largest_timeout_reaches_the_native_side(native, monkeypatch):
  ext = native()
  monkeypatch.setattr(llar_settings, "timeout_ms", config.TIMEOUT_MS_MAX)
  d = _gpu_decide()
  assert (d.reason, d.fast) == ("fast_path", True), d.detail
  assert ext.created == [config.TIMEOUT_MS_MAX * 1_000_000]


@pytest.mark.parametrize("where,error", [
    ("create", TypeError("create_comm_set(): incompatible function arguments. The "
                         "following argument types are supported:\n    1. ...")),
    ("create", OverflowError("int too big to convert")),
    ("create", RuntimeError("jax_llar: devices 0 and 1 are not peers")),
    ("region", TypeError("ensure_region(): incompatible function arguments")),
    ("region", MemoryError()),
])
def test_any_failure_of_creating_the_set_falls_back_with_its_reason(
    native, caplog, where, error):
  ext = native(**{f"{where}_error": error})
  caplog.set_level(logging.INFO, logger="jax_llar")
  d = _gpu_decide()
  assert (d.reason, d.fast, d.candidate) == ("communicator", False, Algorithm.ONE_SHOT_LL)
  kind = type(error).__name__
  if kind != "RuntimeError":
    assert d.detail.startswith(f"{kind}: "), d.detail
  first_line = (str(error).splitlines() or [""])[0]
  assert first_line in d.detail and "\n" not in d.detail
  (record,) = [r for r in caplog.records if "uses lax.psum" in r.getMessage()]
  assert record.levelno == logging.WARNING and d.detail in record.getMessage()
  # Remembered: the next lowering falls back at once, with the same reason.
  again = _gpu_decide()
  assert (again.reason, again.detail) == ("communicator", d.detail)
  assert len(ext.created) <= 1


def test_an_unexpected_error_of_the_set_is_a_fallback_too(native, monkeypatch):
  native()

  def broken(groups):
    raise ZeroDivisionError("a bug\nsecond line")

  monkeypatch.setattr(comm, "for_groups", broken)
  d = _gpu_decide()
  assert d.reason == "communicator"
  assert "ZeroDivisionError: a bug" in d.detail and "second line" not in d.detail


_ANY = st.one_of(_INTS, st.booleans(), st.none(), st.floats(), st.binary(max_size=4),
                 st.text(max_size=8), st.sampled_from(NAMES),
                 st.builds(np.int64, st.integers(-2**63, 2**63 - 1)),
                 st.sampled_from([np.True_, np.False_, np.int8(1), np.uint64(2**64 - 1),
                                  pathlib.Path("/tmp/t.json"), 1.0, [], "a\0b"]))


@HYP
@given(name=st.sampled_from(FIELDS), value=_ANY)
def test_an_assignment_holds_a_checked_value_or_raises_value_error(name, value):
  s = config.Settings()
  try:
    setattr(s, name, value)
  except ValueError as e:
    assert name in str(e) and getattr(s, name) == DEFAULTS[name]
    return
  held = getattr(s, name)
  if name in ("disabled", "signatures"):
    assert type(held) is bool and held == value  # pylint: disable=unidiomatic-typecheck
  elif name in NUMERIC:
    assert type(held) is int and held == value and not isinstance(value, (bool, float))  # pylint: disable=unidiomatic-typecheck
    assert _reaches_natively(name, held)
  else:
    assert type(held) is str and held == (os.fspath(value).strip() or DEFAULTS[name])  # pylint: disable=unidiomatic-typecheck
    assert "\0" not in held and (name != "algorithm" or held in NAMES)


# --- B: unknown settings -------------------------------------------------------------


def test_unknown_settings_raise_naming_the_settings():
  s = config.Settings()
  before = config._generation.get_global()  # pylint: disable=protected-access
  for typo, close in (("max_byte", "max_bytes"), ("timeout", "timeout_ms"),
                      ("disable", "disabled"), ("tuning_files", "tuning_file"),
                      ("signature", "signatures"), ("xyz", None)):
    with pytest.raises(AttributeError) as e:
      setattr(s, typo, 5)
    message = str(e.value)
    assert repr(typo) in message and all(f in message for f in FIELDS), message
    if close:
      assert f"did you mean {close!r}?" in message, message
    else:
      assert "did you mean" not in message
    assert not hasattr(s, typo)  # reading raises the same
    with pytest.raises(AttributeError, match="did you mean" if close else "the settings"):
      getattr(s, typo)
  assert config._generation.get_global() == before  # pylint: disable=protected-access
  assert vars(s) == vars(config.Settings())
  with pytest.raises(AttributeError, match="max_bytes"):
    llar_settings.max_byte = 5
  with pytest.raises(AttributeError, match="cannot be deleted"):
    del s.max_bytes
  with pytest.raises(AttributeError, match="did you mean 'max_bytes'"):
    del s.max_byte


# --- B: string settings, one rule ---------------------------------------------------


def test_a_whitespace_tuning_file_is_unset_and_lowerings_still_work(monkeypatch):
  monkeypatch.setattr(llar_settings, "tuning_file", "  ")
  assert llar_settings.tuning_file == ""
  mesh = mesh_of((2,), ("x",))
  f = jax.jit(jax.shard_map(lambda v: jax_llar.psum(v, "x"), mesh=mesh, in_specs=P("x"),
                            out_specs=P()))
  assert float(f(np.ones(4, np.float32))[0]) == 2.0


_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"),
                max_size=12)


@HYP
@given(name=st.sampled_from(("algorithm", "tuning_file", "tuning_dir")),
       value=st.one_of(_TEXT, st.builds(lambda a, n, b: a + n + b,
                                        st.sampled_from(["", " ", "\t", "\n ", "\u3000"]),
                                        st.sampled_from(NAMES + ["/tmp/t.json", "x"]),
                                        st.sampled_from(["", " ", "\r\n", "\u00a0"]))))
def test_string_settings_read_the_same_from_python_and_the_environment(name, value):
  try:
    from_python = getattr(_assigned(name, value), name)
  except ValueError as e:
    from_python = ("refused", str(e))
  try:
    from_env = getattr(_from_env(**{VARIABLES[name]: value}), name)
  except ValueError as e:
    assert str(e).startswith(f"{config.ENV_PREFIX}{VARIABLES[name]}: "), str(e)
    from_env = ("refused", str(e)[len(f"{config.ENV_PREFIX}{VARIABLES[name]}: "):])
  assert from_python == from_env
  # The rule: stripped; empty means the default.
  want = value.strip() or DEFAULTS[name]
  if not isinstance(from_python, tuple):
    assert from_python == want
  else:
    assert name == "algorithm" and want not in NAMES


def _assigned(name, value):
  s = config.Settings()
  setattr(s, name, value)
  return s


def test_string_settings_refuse_what_no_path_can_be():
  s = config.Settings()
  for name in ("tuning_file", "tuning_dir"):
    for bad in ("a\0b", b"/tmp", 3, None):
      with pytest.raises(ValueError, match=name):
        setattr(s, name, bad)
  with pytest.raises(ValueError, match="algorithm must be a str"):
    s.algorithm = 1
  s.algorithm = " one_shot_ll\n"
  assert s.algorithm == "one_shot_ll" and s.forced() is Algorithm.ONE_SHOT_LL
  s.algorithm = ""
  assert s.algorithm == "auto"


# --- B: the environment -------------------------------------------------------------


@pytest.mark.parametrize("name", FIELDS)
@pytest.mark.parametrize("blank", ["", " ", "\t\n", "\u3000 "])
def test_whitespace_only_means_unset_for_every_variable(name, blank):
  assert getattr(_from_env(**{VARIABLES[name]: blank}), name) == DEFAULTS[name]


def test_whitespace_only_swap_means_unset(monkeypatch):
  for blank in ("", "  ", "\t"):
    monkeypatch.setenv("JAX_LLAR_SWAP", blank)
    assert config.env_bool("JAX_LLAR_SWAP") is False
    assert config.env_bool("JAX_LLAR_SWAP", default=True) is True


@pytest.mark.parametrize("raw", ["١٢", "１２", "߁", "12\u0663", "+5", "-5", "1_000", "0x10",
                                 "1e3", "12.0", "٣"])
def test_integers_are_ascii_digits_only(raw):
  for var in ("JAX_LLAR_MAX_BYTES", "JAX_LLAR_TIMEOUT_MS"):
    with pytest.raises(ValueError) as e:
      _from_env(**{var: raw})
    assert str(e.value).startswith(f"{config.ENV_PREFIX}{var}: must be a decimal integer "
                                   "(ASCII digits 0-9)"), str(e.value)


def test_integers_take_surrounding_whitespace_and_leading_zeros():
  s = _from_env(JAX_LLAR_MAX_BYTES=" 0012\n", JAX_LLAR_TIMEOUT_MS="\t0500 ")
  assert (s.max_bytes, s.timeout_ms) == (12, 500)


@pytest.mark.parametrize("var,raw", [("JAX_LLAR_DISABLE", "maybe"),
                                     ("JAX_LLAR_SIGNATURES", "tru e"),
                                     ("JAX_LLAR_TIMEOUT_MS", "0"),
                                     ("JAX_LLAR_TIMEOUT_MS", "ten"),
                                     ("JAX_LLAR_MAX_BYTES", "-5"),
                                     ("JAX_LLAR_ALGORITHM", "two_shot_maybe")])
def test_every_environment_error_names_the_variable_after_the_prefix(var, raw):
  with pytest.raises(ValueError) as e:
    _from_env(**{var: raw})
  assert str(e.value).startswith(f"{config.ENV_PREFIX}{var}: "), str(e.value)
  assert repr(raw) in str(e.value)


def test_swap_from_the_environment_errors_with_the_prefix(monkeypatch):
  monkeypatch.setenv("JAX_LLAR_SWAP", "garbage")
  with pytest.raises(ValueError) as e:
    config.env_bool("JAX_LLAR_SWAP")
  assert str(e.value) == (f"{config.ENV_PREFIX}JAX_LLAR_SWAP: must be one of 1, true, yes, "
                          "on, 0, false, no, off (or empty), got 'garbage'")
  # At import: one message, the prefix first.
  p = subprocess.run([sys.executable, "-c", "import jax_llar"],
                     env=dict(user_env(), JAX_PLATFORMS="cpu", JAX_LLAR_SWAP="garbage"),
                     capture_output=True, text=True, timeout=120)
  assert p.returncode != 0
  assert (f"ValueError: {config.ENV_PREFIX}JAX_LLAR_SWAP: must be one of"
          in p.stderr.splitlines()[-1]), p.stderr


def _documented(name: str, raw: str):
  """What the module docstring and docs/settings.md say `raw` means for
  setting `name` from its variable: the value, or None (refused)."""
  text = raw.strip()
  if not text:
    return DEFAULTS[name]
  if name in ("disabled", "signatures"):
    if re.fullmatch(r"1|true|yes|on", text, re.I | re.A):
      return True
    if re.fullmatch(r"0|false|no|off", text, re.I | re.A):
      return False
    return None
  if name in NUMERIC:
    if not re.fullmatch(r"[0-9]+", text, re.A):
      return None
    value = int(text) if len(text) < 4000 else 10**4000
    if name == "max_bytes":
      return min(value, config.MAX_BYTES_CAP)
    return value if 1 <= value <= config.TIMEOUT_MS_MAX else None
  if name == "algorithm":
    return text if text in NAMES else None
  return text  # the paths


_RAW = st.one_of(
    _TEXT,
    st.from_regex(r"\A\s{0,2}[0-9]{1,22}\s{0,2}\Z"),
    st.builds(lambda a, b, c: a + b + c, st.sampled_from(["", " ", "\t", "\u2003"]),
              st.sampled_from(["1", "true", "YES", "On", "0", "False", "no", "OFF", "auto",
                               "one_shot_ll", "two_shot_ll128_atomic", "0030000",
                               str(config.TIMEOUT_MS_MAX), str(config.MAX_BYTES_CAP + 1),
                               "١٢", "ſ", "yeſ", "\u212a", "trUE"]),
              st.sampled_from(["", " ", "\n", "\u00a0"])))


@HYP
@given(name=st.sampled_from(FIELDS), raw=_RAW)
def test_the_environment_parser_gives_the_documented_meaning_or_the_prefixed_error(name, raw):
  want = _documented(name, raw)
  try:
    s = _from_env(**{VARIABLES[name]: raw})
  except ValueError as e:
    assert want is None, (name, raw, want, str(e))
    assert str(e).startswith(f"{config.ENV_PREFIX}{VARIABLES[name]}: "), str(e)
    assert "\n" not in str(e)
    return
  assert want is not None, (name, raw, getattr(s, name))
  assert getattr(s, name) == want
  for other in FIELDS:
    if other != name:
      assert getattr(s, other) == DEFAULTS[other]
