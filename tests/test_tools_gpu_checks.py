"""The GPU suite's checks on CPU: a child program of tests/gpu run here (CPU
devices, so jax_llar.psum falls back to lax.psum) must fail the GPU test
that reads it where that test requires the fast path.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import sys

import pytest

GPU_TESTS = pathlib.Path(__file__).parent / "gpu"


def _gpu_test_module(name: str):
  """tests/gpu/<name>.py, imported under a private name (the GPU suite's
  own helpers on the path), without collecting it."""
  if str(GPU_TESTS) not in sys.path:
    sys.path.insert(0, str(GPU_TESTS))
  spec = importlib.util.spec_from_file_location(f"_cpu_view_of_{name}",
                                                GPU_TESTS / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_f5_requires_the_fast_path(monkeypatch):
  """F5 (two threads dispatching) must not pass when the threads raced on
  lax.psum: its child program run on 2 CPU devices prints fast false, no
  hang and no error, and the F5 test rejects that run."""
  failures = _gpu_test_module("test_failures")
  run_program = failures.run_program
  env = {"JAX_PLATFORMS": "cpu",
         "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
         "PYTHONPATH": os.pathsep.join(
             [str(GPU_TESTS.parents[1])] +
             [p for p in [os.environ.get("PYTHONPATH")] if p])}
  result = run_program("two_threads", env=env)
  assert result.data == {"fast": False, "hung": False, "errors": []}, result.tail
  monkeypatch.setattr(failures, "run_program", lambda *a, **k: result)
  with pytest.raises(AssertionError):
    failures.test_f5_two_threads_dispatching()
  fast = type(result)(result.rc, dict(result.data, fast=True), result.tail)
  monkeypatch.setattr(failures, "run_program", lambda *a, **k: fast)
  failures.test_f5_two_threads_dispatching()  # the same run on the fast path passes
