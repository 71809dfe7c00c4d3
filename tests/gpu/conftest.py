"""GPU suite setup: the skip reason, the `gpu` marker and the mesh fixture.

The suite needs at least 2 CUDA GPUs that are NVLink (load/store) peers and
runs only with ``JAX_LLAR_TEST_GPU=1`` (``tests/conftest.py`` forces CPU
devices otherwise):

    JAX_LLAR_TEST_GPU=1 python -m pytest -q -rs tests/gpu

Every test here is marked ``gpu`` and skipped, with the reason, when the
suite cannot run.
"""

from __future__ import annotations

import os
import pathlib

import pytest

import suite_setup

HERE = pathlib.Path(__file__).parent

# The children of the subprocess tests need device memory too.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def gpu_skip_reason() -> str | None:
  """Why the GPU suite cannot run here, or None."""
  reason = suite_setup.cuda_skip_reason("GPU suite", 2, imports=("jax_llar",))
  if reason is not None:
    return reason
  import jax_llar  # pylint: disable=g-import-not-at-top
  st = jax_llar.status()
  if not st["active"]:
    return f"jax_llar fast path inactive: {st['reason']}"
  return None


SKIP_REASON = gpu_skip_reason()


def pytest_collection_modifyitems(config, items):
  del config
  suite_setup.mark_suite(items, HERE, pytest.mark.gpu, SKIP_REASON)


@pytest.fixture(scope="session")
def mesh():
  """A one-axis mesh ``x`` over all devices."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax.sharding import Mesh  # pylint: disable=g-import-not-at-top
  return Mesh(np.array(jax.devices()), ("x",))
