"""nccl_lla2a_one_shot's host side, on CPU: its limits and region size against
what NCCL's own LL all-to-all calls compute (ncclLLA2ACalcSlots and
ncclLLA2ACreateRequirement of the NCCL library, called through ctypes), the
forced-algorithm setting and the policy, the kernel level's
``nccl.lla2a_one_shot`` impl, and the loopback harness's refusal (Python and
native). The kernel itself needs two GPUs (tests/gpu/test_lla2a.py).
"""

from __future__ import annotations

import ctypes
import importlib

import numpy as np
import pytest

from jax_llar import _ext, algorithms, config, policy
from jax_llar.algorithms import Algorithm

LLA2A = Algorithm.NCCL_LLA2A_ONE_SHOT
KERNEL_LINES_PER_BLOCK = 512  # args.h: kLinesPerBlock
BLOCKS = 64                   # args.h: kMaxBlocks
WORLDS = (2, 3, 4, 5, 8, 16)


def _nccl():
  path = _ext.nccl_library_path()
  if path is None:
    pytest.skip("no libnccl.so.2 (the nvidia-nccl wheel is not installed)")
  lib = ctypes.CDLL(path)
  if not hasattr(lib, "ncclLLA2ACreateRequirement"):
    pytest.skip(f"{path} has no LL all-to-all API (NCCL < 2.28)")
  lib.ncclLLA2ACalcSlots.restype = ctypes.c_int
  lib.ncclLLA2ACalcSlots.argtypes = [ctypes.c_int, ctypes.c_int]
  lib.ncclLLA2ACreateRequirement.restype = ctypes.c_int
  return lib


class _Handle(ctypes.Structure):  # nccl_device/impl/ll_a2a__types.h
  _fields_ = [("bufHandle", ctypes.c_uint32), ("nSlots", ctypes.c_uint32)]


def test_limits_and_dtypes():
  assert algorithms.MAX_BYTES[LLA2A] == BLOCKS * KERNEL_LINES_PER_BLOCK * 8 == 256 * 1024
  assert algorithms.MAX_BYTES[LLA2A] == algorithms.MAX_BYTES[Algorithm.ONE_SHOT_LL]
  assert algorithms.DTYPES[LLA2A] == algorithms.SUPPORTED_DTYPES
  assert int(LLA2A) == 5 and LLA2A.short_name == "nccl_lla2a_one_shot"


@pytest.mark.parametrize("world", WORLDS)
def test_region_is_the_buffer_nccl_asks_for(world):
  """The requirement the registry builds (kMaxBlocks sessions of
  ncclLLA2ACalcSlots(world * kLinesPerBlock, 8) slots) asks NCCL for exactly
  region_bytes, the size args.h's RegionBytes gives and status() reports."""
  lib = _nccl()
  slots = lib.ncclLLA2ACalcSlots(world * KERNEL_LINES_PER_BLOCK, 8)
  assert slots == world * KERNEL_LINES_PER_BLOCK  # one 8-byte element per slot
  handle = _Handle()
  req = (ctypes.c_uint64 * 32)()  # room for any version's ncclDevResourceRequirements
  rc = lib.ncclLLA2ACreateRequirement(BLOCKS, slots, ctypes.byref(handle), ctypes.byref(req))
  assert rc == 0
  buffer_size = req[1]  # after the `next` pointer
  assert handle.nSlots == slots
  assert buffer_size == algorithms.region_bytes(LLA2A, world)
  assert buffer_size == BLOCKS * (1 + 2 * slots) * 16


def test_region_bytes_values():
  for world in WORLDS:
    assert algorithms.region_bytes(LLA2A, world) == 64 * 16 + world * 1024 * 1024


def test_forced_setting_accepts_it(monkeypatch):
  monkeypatch.setenv("JAX_LLAR_ALGORITHM", "nccl_lla2a_one_shot")
  assert config._from_env().forced() is LLA2A  # pylint: disable=protected-access
  assert config.Settings(algorithm="nccl_lla2a_one_shot").forced() is LLA2A


def test_policy_serves_it_forced_up_to_its_limit():
  limit = algorithms.MAX_BYTES[LLA2A]
  for dt in algorithms.SUPPORTED_DTYPES:
    for nbytes in (dt.itemsize, 4096, limit):
      c = policy.choose(dt, nbytes, 2, max_bytes=config.MAX_BYTES_CAP, force=LLA2A)
      assert (c.algorithm, c.reason) == (LLA2A, "fast_path"), (dt, nbytes)
  c = policy.choose(np.float32, limit + 4, 2, max_bytes=config.MAX_BYTES_CAP, force=LLA2A)
  assert (c.algorithm, c.reason) == (None, "size")


def test_kernel_level_measures_it_under_its_nccl_name():
  from jax_llar.tools.bench import kernel_level as kernel_level  # pylint: disable=g-import-not-at-top
  spec = kernel_level.KERNEL_IMPLS["nccl.lla2a_one_shot"]
  assert spec == kernel_level.KernelImpl("nccl_lla2a_one_shot")
  assert spec.expect == kernel_level.SUM  # bitwise the rank-order sum
  assert LLA2A.impl not in kernel_level.KERNEL_IMPLS
  assert "nccl.allreduce" in kernel_level.KERNEL_IMPLS
  assert kernel_level.Settings().impls.count("nccl.lla2a_one_shot") == 1


def test_loopback_harness_refuses_it_with_the_reason():
  from jax_llar.tools.loopback import harness as lh  # pylint: disable=g-import-not-at-top
  assert "nccl_lla2a_one_shot" not in lh.ALGORITHMS
  errors = lh.validate(lh.Settings(algorithm="nccl_lla2a_one_shot"))
  assert len(errors) == 1 and "NCCL's LL all-to-all session" in errors[0], errors
  errors = lh.validate(lh.Settings(bitwise_against="nccl_lla2a_one_shot"))
  assert len(errors) == 1 and "bitwise_against" in errors[0], errors


def test_native_loopback_refuses_it_before_any_cuda_call():
  """The native harness's spec check (loopback.cc: an entry with
  lla2a_slots) runs before any CUDA call, so it answers on CPU too."""
  try:
    tools = importlib.import_module("jax_llar.tools._llar_tools")
  except ImportError as e:
    pytest.skip(f"native tools module not built: {e}")
  with pytest.raises(ValueError, match="NCCL's LL all-to-all session"):
    tools.loopback_plan(2, 64, 0, algorithm=int(LLA2A))
