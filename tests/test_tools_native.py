"""jax_llar.tools._native: a tools module that imports but cannot register
its FFI targets leaves a reason, not a silent None."""

from __future__ import annotations

import importlib.machinery
import sys
import types

import pytest

from jax_llar import _ext
from jax_llar.tools import _native


@pytest.fixture
def fresh_native(monkeypatch):
  """_native as before its first load, with the production extension
  reported loaded."""
  monkeypatch.setattr(_native, "_loaded", False)
  monkeypatch.setattr(_native, "_module", None)
  monkeypatch.setattr(_native, "_reason", None)
  monkeypatch.setattr(_ext, "load", lambda: types.SimpleNamespace())

  def install(registrations):
    fake = types.ModuleType(_native.MODULE)
    fake.__spec__ = importlib.machinery.ModuleSpec(_native.MODULE, None)
    fake.registrations = registrations
    monkeypatch.setitem(sys.modules, _native.MODULE, fake)
    return fake

  return install


def _raise():
  raise RuntimeError("the tools module's handlers are missing")


def _reject(name, capsule, platform):
  raise ValueError(f"{name}: not a capsule for {platform}: {capsule!r}")


@pytest.mark.parametrize("registrations, register, want", [
    (_raise, None, "RuntimeError: the tools module's handlers are missing"),
    (lambda: {"jax_llar_copy": "x"}, _reject, "ValueError: jax_llar_copy: not a capsule"),
], ids=["registrations_raises", "register_rejects"])
def test_failed_registration_is_the_reason(fresh_native, monkeypatch, registrations,
                                           register, want):
  if register is not None:
    monkeypatch.setattr(_native.jax.ffi, "register_ffi_target", register)
  fresh_native(registrations)
  assert _native.load() is None
  assert _native.reason() is not None and "cannot register" in _native.reason()
  with pytest.raises(RuntimeError) as e:
    _native.require("the kernel bench")
  message = str(e.value)
  assert message.startswith("the kernel bench needs the native tools module: ")
  assert not message.endswith(": None") and want in message
  assert _native.load() is None  # idempotent: no second attempt


def test_loaded_module_has_no_reason(fresh_native, monkeypatch):
  registered = []
  monkeypatch.setattr(_native.jax.ffi, "register_ffi_target",
                      lambda name, capsule, platform: registered.append((name, platform)))
  fake = fresh_native(lambda: {"jax_llar_copy": "capsule"})
  assert _native.require("the copy call") is fake
  assert _native.reason() is None and registered == [("jax_llar_copy", "CUDA")]


def test_fault_injection_names_the_faults_it_knows():
  """set_fault_for_testing (issue 12, item 5) refuses an unknown fault by
  name before it looks for the communicator set (no GPU needed)."""
  try:
    import jax_llar.tools._llar_tools as tools  # pylint: disable=g-import-not-at-top
  except ImportError as e:  # not built (no nvcc), or no libnccl.so.2 to load it with
    pytest.skip(f"the tools module does not load here: {e}")
  with pytest.raises(ValueError, match="known: none, drop_peer_writes, corrupt_flag, "
                                       "delay_rank"):
    tools.set_fault_for_testing(1, 0, "bit_rot")
  # A known fault goes on to the registry, which has no such set here.
  with pytest.raises(RuntimeError, match="communicator set"):
    tools.set_fault_for_testing(12345, 0, "delay_rank")


def test_registration_fault_and_one_device_epochs_refuse_an_unknown_set():
  """The hooks of the given-up-set GPU test (tests/gpu/test_failures.py::
  test_f11_a_set_given_up_after_use_keeps_its_memory) name the set they
  cannot find (no GPU needed)."""
  try:
    import jax_llar.tools._llar_tools as tools  # pylint: disable=g-import-not-at-top
  except ImportError as e:  # not built (no nvcc), or no libnccl.so.2 to load it with
    pytest.skip(f"the tools module does not load here: {e}")
  with pytest.raises(RuntimeError, match="^jax_llar: no communicator set 12345$"):
    tools.fail_next_registration_for_testing(12345)
  with pytest.raises(RuntimeError, match="communicator set 12345"):
    tools.set_epoch_for_testing(12345, 1 << 20, device=1)
