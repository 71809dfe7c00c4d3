"""Settings parsing and the dispatch refusals that do not need a GPU."""

import jax
import numpy as np
import pytest
from jax._src.sharding_impls import SPMDAxisContext
from jax.sharding import Mesh

from jax_llar import comm, config, dispatch


def _settings_with(monkeypatch, **env):
  """The settings jax_llar would read at import with `env` set."""
  for k, v in env.items():
    monkeypatch.setenv(k, v)
  return config._from_env()


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
  with pytest.raises(ValueError, match="jax_llar settings"):
    _settings_with(monkeypatch, **env)


def test_settings_assignment_is_checked():
  s = config.Settings()
  for name, bad in [("timeout_ms", -1), ("timeout_ms", 0), ("max_bytes", -1),
                    ("max_bytes", config.ONE_SHOT_LIMIT_BYTES + 1), ("max_bytes", 1.5)]:
    with pytest.raises(ValueError):
      setattr(s, name, bad)
  s.max_bytes = 0
  s.timeout_ms = 5
  assert (s.max_bytes, s.timeout_ms) == (0, 5)
  assert config.settings.max_bytes == config.ONE_SHOT_LIMIT_BYTES  # default cap


def test_concurrent_command_buffer_scheduling_falls_back(monkeypatch):
  mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
  aval = jax.core.ShapedArray((16,), np.float32)
  monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_command_buffer_scheduling_mode=CONCURRENT")
  d = dispatch.decide(SPMDAxisContext(mesh), aval, ("x",))
  assert (d.impl, d.reason) == ("lax.psum", "xla_flags")
  monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_command_buffer_scheduling_mode=LHS")
  assert dispatch.decide(SPMDAxisContext(mesh), aval, ("x",)).reason == "platform"


def test_cached_communicator_failure_is_raised_fresh(monkeypatch):
  key = ((90, 91),)
  monkeypatch.setitem(comm._sets, key, comm.CommError("devices 90 and 91 are not peers"))
  errors = []
  for _ in range(3):
    with pytest.raises(comm.CommError, match="not peers") as e:
      comm.get_or_create([[90, 91]])
    errors.append(e.value)
  assert len({id(e) for e in errors}) == 3  # no traceback grows across lowerings
