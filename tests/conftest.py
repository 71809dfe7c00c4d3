"""Test setup shared by the CPU and GPU suites.

The CPU suite (every test file but ``test_gpu.py``) runs on 8 forced host
devices and builds meshes of 2, 4 and 8 of them. XLA reads
``--xla_force_host_platform_device_count`` only when JAX starts its CPU
backend, so the flag is set here, before any test module imports jax.

The GPU suite sets ``JAX_LLAR_TEST_GPU=1``; then nothing is changed and JAX
sees the real accelerators.
"""

from __future__ import annotations

import os
import sys

CPU_DEVICE_COUNT = 8

if os.environ.get("JAX_LLAR_TEST_GPU") != "1":
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
