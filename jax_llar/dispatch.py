"""Dispatch policy: which psums take the fast path, decided at lowering time.

The decision uses the per-rank payload size, dtype, world size, the mesh and
the tuning table below. Anything else lowers to ``lax.psum`` (NCCL through
XLA) and the reason is logged once (``jax_llar.dispatch_log()`` keeps all).

Tuning table: one algorithm today, the one-shot LL kernel, for payloads up to
its scratch limit (256 KiB per rank); each entry names the measurement behind
it. World sizes above 2 use the same rule but are not measured yet.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re

import jax
import numpy as np
from jax._src import mesh as mesh_lib
from jax._src.interpreters import pxla
from jax._src.sharding_impls import SPMDAxisContext

from jax_llar import _ext, _log, comm
from jax_llar.config import settings

SUPPORTED_DTYPES = (np.dtype(np.float32), np.dtype(jax.numpy.bfloat16),
                    np.dtype(np.float16))
MAX_RANKS = 16  # ffi/include/llar/args.h: kMaxRanks


@dataclasses.dataclass(frozen=True)
class TuningEntry:
  """Use `algorithm` for world sizes in [min_world, max_world] and payloads
  up to `max_bytes` per rank; `source` says where the rule comes from."""
  algorithm: str
  algorithm_id: int
  min_world: int
  max_world: int
  max_bytes: int
  source: str


TUNING_TABLE = (
    TuningEntry("one_shot_ll", 1, 2, 2, 256 * 1024,
                "2 x H200: see the README's performance section"),
    TuningEntry("one_shot_ll", 1, 3, MAX_RANKS, 256 * 1024,
                "not measured (no 4- or 8-GPU machine lent yet); the 2-rank "
                "limit"),
)


def _entry_for(world: int, nbytes: int) -> TuningEntry | None:
  for e in TUNING_TABLE:
    if e.min_world <= world <= e.max_world and nbytes <= e.max_bytes:
      return e
  return None


def _fallback(reason: str, detail: str, axes, dtype, nbytes, world=0,
              level=logging.WARNING) -> _log.Decision:
  return _log.record(
      _log.Decision("lax.psum", reason, detail, tuple(axes), str(dtype),
                    int(nbytes), world), level=level)


def replica_groups(axis_ctx, axes) -> list[list[jax.Device]]:
  """Replica groups of a psum over `axes`, as devices, in rank order.

  Mirrors JAX's psum lowering: groups of partition indices of the flattened
  mesh (``pxla.axis_groups``); partition i runs on ``mesh.devices.flat[i]``.
  """
  flat = list(axis_ctx.mesh.devices.flat)
  return [[flat[i] for i in g] for g in pxla.axis_groups(axis_ctx, tuple(axes))]


def decide(axis_ctx, aval, axes) -> _log.Decision:
  """Decides how to lower a psum of `aval` over `axes` on CUDA.

  Returns a Decision; when it is a fallback the reason has been logged once.
  Never raises for unsupported input: every refusal becomes a fallback.
  """
  dtype = np.dtype(aval.dtype)
  nbytes = int(np.prod(aval.shape, dtype=np.int64)) * dtype.itemsize
  fb = lambda reason, detail, world=0, level=logging.WARNING: _fallback(
      reason, detail, axes, dtype, nbytes, world, level)
  if settings.disabled:
    return fb("disabled", "JAX_LLAR_DISABLE is set", level=logging.INFO)
  if re.search(r"xla_gpu_command_buffer_scheduling_mode\s*=\s*CONCURRENT",
               os.environ.get("XLA_FLAGS", ""), re.I):
    # In this mode XLA orders graph nodes only by declared buffer uses; two
    # independent all-reduces could overlap on one GPU and share the
    # communicator's epoch counters.
    return fb("xla_flags", "--xla_gpu_command_buffer_scheduling_mode=CONCURRENT "
              "can run independent custom calls concurrently")
  if dtype not in SUPPORTED_DTYPES:
    return fb("dtype", f"dtype {dtype} is not one of float32, bfloat16, float16")
  if nbytes == 0:
    return fb("empty", "empty array", level=logging.INFO)
  if not isinstance(axis_ctx, SPMDAxisContext) or not isinstance(
      axis_ctx.mesh, mesh_lib.Mesh):
    return fb("mesh", "no concrete mesh at lowering time (use jax.shard_map "
              "with a jax.sharding.Mesh, or jax.set_mesh)")
  groups = replica_groups(axis_ctx, axes)
  world = len(groups[0])
  if world < 2:
    return fb("world_size", "a replica group of one device needs no reduction",
              world, level=logging.INFO)
  if world > MAX_RANKS:
    return fb("world_size", f"replica groups of {world} devices exceed the "
              f"{MAX_RANKS} the kernels serve", world)
  if nbytes > settings.max_bytes:
    return fb("size", f"more than {settings.max_bytes} bytes per rank (the "
              "one-shot limit; JAX_LLAR_MAX_BYTES)", world)
  entry = _entry_for(world, nbytes)
  if entry is None:
    return fb("size", f"no tuning entry for world {world}, {nbytes} bytes", world)
  devices = [d for g in groups for d in g]
  if jax.process_count() > 1 or any(
      d.process_index != jax.process_index() for d in devices):
    return fb("multiprocess", "groups spanning several processes are not "
              "served yet (one process must drive all GPUs of the group)", world)
  if any(d.platform != "gpu" for d in devices):
    return fb("platform", "the mesh holds non-GPU devices", world)
  if _ext.load() is None:
    return fb("extension", _ext.reason() or "extension unavailable", world)
  try:
    cs = comm.get_or_create([[d.local_hardware_id for d in g] for g in groups])
  except comm.CommError as e:
    return fb("communicator", str(e), world)
  return _log.record(_log.Decision(
      f"llar.{entry.algorithm}", "fast_path",
      f"{entry.algorithm} over {world} ranks", tuple(axes), str(dtype), nbytes,
      world, cs.comm_id, cs.key))


def algorithm_id(decision: _log.Decision) -> int:
  """The FFI ``algorithm`` attribute for a fast-path decision."""
  for e in TUNING_TABLE:
    if decision.impl == f"llar.{e.algorithm}":
      return e.algorithm_id
  raise ValueError(f"not a fast-path decision: {decision}")
