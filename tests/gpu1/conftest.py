"""One-GPU suite setup: the skip reason and the `one_gpu` marker.

These tests need ONE CUDA GPU (the loopback harness simulates every rank of a
group on it) and run only with ``JAX_LLAR_TEST_GPU=1`` (``tests/conftest.py``
forces CPU devices otherwise):

    JAX_LLAR_TEST_GPU=1 python -m pytest -q -rs tests/gpu1

Every test here is marked ``one_gpu`` and skipped, with the reason, when the
suite cannot run. The loopback tool runs in this process
(loopback_helpers.py); its fault modes and a few other tools run in child
processes, which may lose their CUDA context on purpose. The fault children
start in the background at the session's start (background.py); the fault
tests and then the sanitizer's cross-section run last.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib

import pytest

HERE = pathlib.Path(__file__).parent

# The children need device memory too; and the loopback harness, which runs
# in this process (loopback_helpers.py), gives each simulated rank a stream
# with a hardware queue of its own: both read when CUDA starts.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")


def _load_suite_setup():
  """tests/gpu/suite_setup.py, by its path."""
  path = HERE.parent / "gpu" / "suite_setup.py"
  spec = importlib.util.spec_from_file_location("suite_setup", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


suite_setup = _load_suite_setup()


def one_gpu_skip_reason() -> str | None:
  """Why the one-GPU suite cannot run here, or None."""
  reason = suite_setup.cuda_skip_reason("one-GPU suite", 1)
  if reason is not None:
    return reason
  from jax_llar.tools import _native  # pylint: disable=g-import-not-at-top
  if _native.load() is None:
    return f"the native tools module is unavailable: {_native.reason()}"
  return None


SKIP_REASON = one_gpu_skip_reason()


def pytest_configure(config):
  config.addinivalue_line(
      "markers", "one_gpu: needs one CUDA GPU (ranks simulated on it; tests/gpu1)")


# The tests that wait for the background's work, in the order they run last:
# every fault child has ended before the sanitized fault unit starts.
LAST = ("test_faults_loopback.py", "test_sanitize.py")


def _last(item) -> int:
  path = pathlib.Path(str(item.fspath))
  return LAST.index(path.name) + 1 if path.parent == HERE and path.name in LAST else 0


def pytest_collection_modifyitems(config, items):
  del config
  suite_setup.mark_suite(items, HERE, pytest.mark.one_gpu, SKIP_REASON)
  items.sort(key=_last)  # stable: every other test keeps its place


@pytest.fixture(name="background", scope="session", autouse=True)
def _background(request):
  """The session's background work (background.py): the fault cases of the
  fault tests that were selected (the session's items, after -k and -m),
  started before the first test; None when none was, or the suite cannot
  run here."""
  names = {item.callspec.params["name"] for item in request.session.items
           if _last(item) == 1 and hasattr(item, "callspec")}
  if SKIP_REASON is not None or not names:
    yield None
    return
  import background  # pylint: disable=g-import-not-at-top
  bg = background.Background(names)
  try:
    yield bg
  finally:
    bg.close()
