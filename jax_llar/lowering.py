"""The lowering rules of ``llar_psum_p``: when a psum becomes the FFI call.

At lowering time, for every platform, `decide`:
  1. gathers the facts: dtype, bytes per rank, and, whenever the axis
     context holds a concrete mesh, the replica groups and so the number of
     ranks (JAX's own grouping, ``pxla.axis_groups``);
  2. asks the pure policy (``jax_llar.policy.choose``) which algorithm the
     psum itself calls for;
  3. checks the environment, in this order: ``JAX_LLAR_DISABLE``; XLA flags
     (concurrent command-buffer scheduling); the platform (lowering for CUDA,
     devices that are GPUs); one process driving every device of the groups;
     the extension (``jax_llar._ext``); a communicator set for the groups
     (``jax_llar.comm``).
Every decision is recorded (``jax_llar.dispatch_log()``), and each reason not
to take the fast path is logged once. A refusal by the environment keeps the
policy's choice as ``candidate``, so a decision taken on CPU says what CUDA
GPUs that are NVLink peers would run.

The CUDA rule emits ``jax.ffi.ffi_lowering("jax_llar_all_reduce")`` with the
static attributes ``comm_id``, ``comm_key`` and ``algorithm``; every other
lowering is exactly that of ``lax.psum``.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any, Sequence

import jax
import numpy as np
from jax import lax
from jax._src import config as jax_config
from jax._src import mesh as mesh_lib
from jax._src.interpreters import mlir, pxla
from jax._src.sharding_impls import SPMDAxisContext

from jax_llar import _ext, comm, log, policy
from jax_llar.config import settings

# The original function, captured at import (jax_llar.swap_psum replaces the
# attribute jax.lax.psum): every fallback must reach XLA's psum.
_lax_psum = lax.psum

# Reasons logged at INFO rather than WARNING: the user asked for them, or
# nothing is lost (so is "world_size" for a group of one device).
_INFO_REASONS = frozenset({"disabled", "empty"})

_CONCURRENT_FLAG = re.compile(
    r"xla_gpu_command_buffer_scheduling_mode\s*=\s*CONCURRENT", re.I)


def replica_groups(axis_ctx, axes: Sequence) -> list[list[Any]] | None:
  """Replica groups of a psum over `axes`, as devices, in rank order.

  Mirrors JAX's psum lowering: groups of partition indices of the flattened
  mesh (``pxla.axis_groups``); partition i runs on ``mesh.devices.flat[i]``.

  Returns:
    One list of devices per replica group, or None when `axis_ctx` holds no
    concrete mesh (not an SPMDAxisContext, or an abstract mesh) or does not
    know an axis of `axes`.
  """
  if not isinstance(axis_ctx, SPMDAxisContext) or not isinstance(
      axis_ctx.mesh, mesh_lib.Mesh):
    return None
  try:
    index_groups = pxla.axis_groups(axis_ctx, tuple(axes))
  except NameError:  # an axis the mesh does not have
    return None
  flat = list(axis_ctx.mesh.devices.flat)
  return [[flat[i] for i in g] for g in index_groups]


def _refused_by_environment(groups, platform: str) -> tuple[str, str] | None:
  """(reason, detail) of the first environment check that refuses the fast
  path, or None when the environment allows it. Checked in the order of the
  module docstring, up to the extension (the communicator comes last, in
  `decide`)."""
  if settings.disabled:
    return "disabled", "JAX_LLAR_DISABLE is set"
  if _CONCURRENT_FLAG.search(os.environ.get("XLA_FLAGS", "")):
    # In this mode XLA orders graph nodes only by declared buffer uses; two
    # independent all-reduces could overlap on one GPU and share the
    # communicator's epoch counters.
    return ("xla_flags", "--xla_gpu_command_buffer_scheduling_mode=CONCURRENT "
            "can run independent custom calls concurrently")
  if platform != "cuda":
    return "platform", f"lowering for {platform}: the fast path is CUDA-only"
  devices = [d for g in groups for d in g]
  others = sorted({d.platform for d in devices} - {"gpu"})
  if others:
    return ("platform", f"the mesh holds non-GPU devices ({', '.join(others)}): "
            "the fast path is CUDA-only")
  if jax.process_count() > 1 or any(
      d.process_index != jax.process_index() for d in devices):
    return ("multiprocess", "groups spanning several processes are not served "
            "yet (one process must drive all GPUs of the group)")
  if _ext.load() is None:
    return "extension", _ext.reason() or "extension unavailable"
  return None


def _on_nvlink_gpus(candidate) -> str:
  return (f"; on CUDA GPUs that are NVLink peers, driven by one process, this "
          f"psum would run {candidate.short_name}")


def decide(axis_ctx, aval, axes: Sequence, *, platform: str) -> log.Decision:
  """Decides how to lower a psum of `aval` over `axes` for `platform`.

  Args:
    axis_ctx: the lowering's axis context
      (``ctx.module_context.axis_context``).
    aval: the operand's abstract value (shape and dtype of one rank's
      payload).
    axes: the reduced mesh axis names.
    platform: the lowering platform (``"cuda"``, ``"cpu"``, ...).

  Returns:
    The recorded Decision. A refusal has been logged once per (reason,
    detail). On the fast path the communicator set exists (created here the
    first time its groups are seen). Never raises for an unsupported psum:
    every refusal becomes a lax.psum decision.
  """
  axes = tuple(axes)
  dtype = aval.dtype
  try:
    itemsize = np.dtype(dtype).itemsize
  except TypeError:  # extended dtypes: the policy refuses them by dtype
    itemsize = 0
  nbytes = int(np.prod(aval.shape, dtype=np.int64)) * itemsize
  groups = replica_groups(axis_ctx, axes)
  world = len(groups[0]) if groups else 0
  choice = policy.choose(dtype, nbytes, world, max_bytes=settings.max_bytes)

  def record(reason, detail, **kw):
    info = reason in _INFO_REASONS or (reason == "world_size" and world < 2)
    return log.record(log.Decision(
        reason=reason, detail=detail, axes=axes, dtype=str(dtype),
        bytes_per_rank=nbytes, world_size=world, **kw),
        level=logging.INFO if info else logging.WARNING)

  if choice.algorithm is None:
    return record(choice.reason, choice.detail)
  candidate = choice.algorithm
  refusal = _refused_by_environment(groups, platform)
  if refusal is None:
    try:
      cs = comm.get_or_create([[d.local_hardware_id for d in g] for g in groups])
    except comm.CommError as e:
      refusal = ("communicator", str(e))
  if refusal is not None:
    reason, detail = refusal
    return record(reason, detail + _on_nvlink_gpus(candidate),
                  candidate=candidate)
  return record("fast_path", choice.detail, algorithm=candidate,
                candidate=candidate, comm_id=cs.comm_id, comm_key=cs.key)


# --- the rules ----------------------------------------------------------------


def lax_psum_lowering(ctx, x, *, axes, check_vma):
  """Lowers like ``lax.psum(x, axes)`` with the primitive's `check_vma`."""
  def f(v):
    with jax_config._check_vma(check_vma):  # pylint: disable=protected-access
      return _lax_psum(v, axes)
  return mlir.lower_fun(f, multiple_results=False)(ctx, x)


def _lowering(ctx, x, *, axes, check_vma, platform):
  decision = decide(ctx.module_context.axis_context, ctx.avals_in[0], axes,
                    platform=platform)
  if not decision.fast:
    return lax_psum_lowering(ctx, x, axes=axes, check_vma=check_vma)
  return jax.ffi.ffi_lowering(_ext.TARGET_ALL_REDUCE)(
      ctx, x, comm_id=np.int64(decision.comm_id),
      comm_key=np.int64(decision.comm_key),
      algorithm=np.int64(int(decision.algorithm)))


def lowering_cuda(ctx, x, *, axes, check_vma):
  """The CUDA lowering rule: `decide`, then the FFI call or lax.psum's."""
  return _lowering(ctx, x, axes=axes, check_vma=check_vma, platform="cuda")


def lowering_default(ctx, x, *, axes, check_vma):
  """The rule of every other platform: `decide` (which records the facts and
  refuses with reason "platform"), then lax.psum's lowering."""
  platforms = [p for p in ctx.module_context.platforms if p != "cuda"]
  return _lowering(ctx, x, axes=axes, check_vma=check_vma,
                   platform=", ".join(platforms) or "this platform")
