"""What the two GPU suites' conftests share (not a test file itself): the
skip reason's common part and the marking of a suite's items.

``tests/gpu/conftest.py`` imports it; ``tests/gpu1/conftest.py`` loads it by
its path (the one-GPU suite may run without this folder being collected).
It imports nothing heavy at module level: the conftests read it before any
test module starts JAX.
"""

from __future__ import annotations

import importlib
import os
import pathlib

import pytest


def cuda_skip_reason(suite: str, gpus: int, imports=()) -> str | None:
  """Why `suite` (its name in the message) cannot run for want of
  JAX_LLAR_TEST_GPU=1 or of `gpus` CUDA devices, or None; the modules named
  in `imports` are imported first, before JAX starts its backends."""
  if os.environ.get("JAX_LLAR_TEST_GPU") != "1":
    return f"{suite} runs only with JAX_LLAR_TEST_GPU=1 (CPU devices are forced otherwise)"
  import jax  # pylint: disable=g-import-not-at-top
  for name in imports:
    importlib.import_module(name)
  needs = "a CUDA GPU" if gpus == 1 else f"{gpus} CUDA GPUs"
  try:
    n = len(jax.devices("cuda"))
  except RuntimeError as e:
    return f"needs {needs}; JAX has no CUDA backend ({e})"
  if n < gpus:
    return f"needs {needs}; found {n}"
  return None


def mark_suite(items, here: pathlib.Path, marker, skip_reason: str | None) -> None:
  """Adds `marker` to every item under `here`, and a skip with
  `skip_reason` when it is not None."""
  for item in items:
    if here in pathlib.Path(str(item.path)).parents:
      item.add_marker(marker)
      if skip_reason is not None:
        item.add_marker(pytest.mark.skip(reason=skip_reason))
