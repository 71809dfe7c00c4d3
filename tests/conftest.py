"""Test setup shared by the CPU and GPU suites.

CPU mode (the default): the CPU test files in this directory run on 8 forced
host devices and build meshes of 2, 4 and 8 of them. XLA reads
``--xla_force_host_platform_device_count`` only when JAX starts its CPU
backend, so the flag is set here, before any test module imports jax.
``tests/gpu/`` and ``tests/gpu1/`` are collected too; their own conftests skip
them, with the reason.

GPU mode (``JAX_LLAR_TEST_GPU=1``): nothing is changed, JAX sees the real
accelerators, and only the GPU folders are collected: ``tests/gpu/`` (2+
GPUs) and ``tests/gpu1/`` (one GPU: the loopback harness), each with its own
skip reason.
"""

from __future__ import annotations

import os
import pathlib
import sys

import pytest

CPU_DEVICE_COUNT = 8
GPU_MODE = os.environ.get("JAX_LLAR_TEST_GPU") == "1"

if GPU_MODE:
  collect_ignore = sorted(
      p.name for p in pathlib.Path(__file__).parent.glob("test_*.py"))
else:
  if "jax" in sys.modules:
    from jax._src import xla_bridge as _xb  # pylint: disable=g-import-not-at-top
    if _xb._backends:  # pylint: disable=protected-access
      raise RuntimeError(
          "tests/conftest.py: JAX started its backends before the test "
          "configuration could force host devices; run pytest without "
          "plugins that initialise JAX")
  os.environ["XLA_FLAGS"] = " ".join(
      f for f in (os.environ.get("XLA_FLAGS", ""),
                  f"--xla_force_host_platform_device_count={CPU_DEVICE_COUNT}")
      if f)
  os.environ["JAX_PLATFORMS"] = "cpu"

  @pytest.fixture(autouse=True)
  def _fresh_dispatch_log():
    """Every CPU test starts with an empty dispatch log (and nothing logged)."""
    import jax_llar  # pylint: disable=g-import-not-at-top
    jax_llar.clear_dispatch_log()
    yield
