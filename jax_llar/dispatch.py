"""How a psum lowers: `decide`, the dispatch of one requested psum.

For a psum requested for the fast path (``jax_llar.swap.requested``), at
lowering time, `decide`:
  1. gathers the facts per operand: dtype, bytes per rank, and, whenever
     the axis context holds a concrete mesh, the replica groups and so the
     number of ranks (JAX's own grouping, ``pxla.axis_groups``);
  2. asks the pure policy (``jax_llar.policy.choose``) which algorithm the
     psum itself calls for (psums with ``axis_index_groups`` or positional
     axes are JAX's), with the tuning table for the devices' architecture
     (their ``compute_capability``) and the number of ranks
     (``jax_llar.table_lookup.for_devices``; none: the default rule, said
     once in the log); devices of several architectures get lax.psum
     (reason "architecture");
  3. checks the environment, in this order: ``JAX_LLAR_DISABLE``; a lowering
     for ``jax.export``; XLA flags (concurrent command-buffer scheduling,
     ``jax_llar.inputs``); the platform (lowering for CUDA alone, devices
     that are GPUs); one process driving every device of the groups, or
     ``jax.distributed``; the extension (``jax_llar._ext``);
  4. asks ``jax_llar.comm`` for the groups' communicator set and the
     algorithm's symmetric scratch (made the first time, ``comm.for_groups``):
     any failure there is a fallback too (reason "communicator").
Every decision is recorded (``jax_llar.dispatch_log()``), and each reason
not to take the fast path is logged once. A refusal by the environment
keeps the policy's choice as ``candidate``, so a decision taken on CPU says
what CUDA GPUs that are NVLink peers would run. The lowering rules
(``jax_llar.lowering``, ``jax_llar.fused``) emit what the decision says.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

import numpy as np
from jax._src import core
from jax._src import mesh as mesh_lib
from jax._src.interpreters import pxla
from jax._src.sharding_impls import SPMDAxisContext

from jax_llar import _ext, agreement, comm, inputs, log, policy, table_lookup
from jax_llar.algorithms import MAX_BYTES
from jax_llar.config import settings

# Reasons logged at INFO rather than WARNING: the user asked for them, or
# nothing is lost (so is "world_size" for a group of one device, and
# "platform" for a lowering that is not for CUDA: on a machine without GPUs
# every psum is lax.psum, as expected).
_INFO_REASONS = frozenset({"disabled", "empty", "export", "symbolic_shape"})

# Reasons that say the environment is broken: WARNING whoever asked.
_FAILURE_REASONS = frozenset({"xla_flags", "multiprocess", "extension",
                              "communicator"})


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


def _refused_by_environment(groups, platform: str,
                            for_export: bool) -> tuple[str, str] | None:
  """(reason, detail) of the first environment check that refuses the fast
  path, or None when the environment allows it. Checked in the order of the
  module docstring, up to the extension (the communicator comes last, in
  `decide`)."""
  if settings.disabled:
    return "disabled", "JAX_LLAR_DISABLE is set"
  if for_export:
    return ("export", "jax.export lowers psums as JAX does: the fast path's "
            "communicator exists only in the process that lowered it")
  if inputs.concurrent_scheduling():
    return ("xla_flags", "--xla_gpu_command_buffer_scheduling_mode=CONCURRENT "
            "can run independent custom calls concurrently")
  if platform != "cuda":
    return "platform", f"lowering for {platform}: the fast path is CUDA-only"
  devices = [d for g in groups for d in g]
  others = sorted({d.platform for d in devices} - {"gpu"})
  if others:
    return ("platform", f"the mesh holds non-GPU devices ({', '.join(others)}): "
            "the fast path is CUDA-only")
  if comm.spans_processes(devices) and agreement.store() is None:
    return ("multiprocess", "the replica groups span processes and "
            "jax.distributed is not initialised: call jax.distributed.initialize "
            "(its key-value store carries the communicators' ids)")
  if _ext.load() is None:
    return "extension", _ext.reason() or "extension unavailable"
  return None


def _automatic_axes(axis_ctx) -> list[str]:
  """Mesh axes of size > 1 that the enclosing shard_map leaves automatic
  (``axis_names=``): XLA's partitioner has no sharding rule for the FFI call
  and would gather the operand over them."""
  if not isinstance(axis_ctx, SPMDAxisContext) or not isinstance(
      axis_ctx.mesh, mesh_lib.Mesh):
    return []
  manual = set(axis_ctx.manual_axes or ())
  if not manual:  # not inside a shard_map (no psum lowers there)
    return []
  return [str(a) for a, n in axis_ctx.mesh.shape.items() if a not in manual and n > 1]


def _refused_for_clusters(groups) -> tuple[str, str] | None:
  """The fused kernel's thread block clusters need compute capability 9.0."""
  for d in (d for g in groups for d in g):
    cc = str(getattr(d, "compute_capability", "0"))
    try:
      major = int(cc.split(".")[0])
    except ValueError:
      major = 0
    if major < 9:
      return ("platform", f"the fused kernel needs compute capability 9.0 or "
              f"later (thread block clusters); {d} has {cc}")
  return None


def _on_nvlink_gpus(candidate, op: str = "psum") -> str:
  what = (candidate.short_name if op == "psum"
          else f"the fused {candidate.short_name} + add + RMSNorm kernel")
  return (f"; on CUDA GPUs that are NVLink peers on one node, this "
          f"{op} would run {what}")


def _log_default_rule(found: table_lookup.Lookup, source: str) -> None:
  """Says once per (architecture, ranks) that GPUs of a known architecture
  have no tuning table (a warning for an explicit jax_llar.psum)."""
  if found.table is not None or found.refusal or found.architecture is None:
    return
  default = policy.DEFAULT_ALGORITHM
  log.log_once(f"tuning:{found.architecture}:{found.ranks}", (
      f"jax_llar: {found.note}: the default rule decides ({default.short_name} "
      f"up to {MAX_BYTES[default]} bytes per rank, lax.psum above); "
      "python -m jax_llar.tools.tune measures this machine and writes its table"),
      logging.WARNING if source == "psum" else logging.INFO)


def decide(axis_ctx, aval, axes: Sequence, *, platform: str,
           source: str = "psum", axis_index_groups=None,
           for_export: bool = False, op: str = "psum",
           shape_refusal: str | None = None) -> log.Decision:
  """Decides how to lower a psum of `aval` over `axes` for `platform`.

  Args:
    axis_ctx: the lowering's axis context
      (``ctx.module_context.axis_context``).
    aval: the operand's abstract value (shape and dtype of one rank's
      payload).
    axes: the reduced axes: mesh axis names, and positional (integer) axes.
    platform: the lowering platform (``"cuda"``, ``"cpu"``, ...; several
      joined by ", " for a lowering for several platforms at once).
    source: who requested the fast path (``jax_llar.swap.requested``):
      ``"psum"``, ``"swap"`` or ``"install"``. Refusals for an explicit
      ``jax_llar.psum`` are logged at WARNING; for the swaps, only refusals
      that say the environment is broken are.
    axis_index_groups: the psum's index groups (such psums are JAX's).
    for_export: the lowering is for ``jax.export``.
    op: ``"psum"``, or ``"psum_add_rms_norm"`` for the fused op, whose
      kernel also needs thread block clusters (compute capability 9.0 or
      later, checked with the platform).
    shape_refusal: for the fused op, why its kernel does not serve the
      shapes and dtypes (``algorithms.add_rms_norm_refusal``), or None;
      checked right after the policy (reason "shape").

  Returns:
    The recorded Decision. A refusal has been logged once per (reason,
    detail). On the fast path the communicator set exists (created here the
    first time its groups are seen). Never raises for an unsupported psum:
    every refusal becomes a lax.psum decision, and so does any failure of
    creating the communicator set or its scratch (reason "communicator",
    the error in the detail).

  Raises:
    jax_llar.tuning.TuningTableError: the tuning table for the devices and
      number of ranks (or JAX_LLAR_TUNING_FILE) is a broken file; the
      message names it.
  """
  axes = tuple(axes)
  dtype = aval.dtype
  try:
    itemsize = np.dtype(dtype).itemsize
  except TypeError:  # extended dtypes: the policy refuses them by dtype
    itemsize = 0
  symbolic = not core.is_constant_shape(aval.shape)
  nbytes = 0 if symbolic else int(np.prod(aval.shape, dtype=np.int64)) * itemsize
  named = tuple(a for a in axes if not isinstance(a, int))
  groups = replica_groups(axis_ctx, named) if named else None
  world = len(groups[0]) if groups else 0

  def record(reason, detail, **kw):
    if reason in _FAILURE_REASONS:
      info = False
    elif source != "psum":
      info = True
    else:
      info = (reason in _INFO_REASONS or (reason == "world_size" and world < 2)
              or (reason == "platform" and "cuda" not in platform))
    return log.record(log.Decision(
        reason=reason, detail=detail, axes=axes, dtype=str(dtype),
        bytes_per_rank=nbytes, world_size=world, source=source, op=op, **kw),
        level=logging.INFO if info else logging.WARNING)

  if axis_index_groups is not None:
    world = len(axis_index_groups[0]) if len(axis_index_groups) else 0
    return record("axis_index_groups", "psum with axis_index_groups is lax.psum's")
  if len(named) != len(axes):
    return record("positional_axes", "psum over positional axes is lax.psum's")
  if symbolic:
    return record("symbolic_shape", "a shape with symbolic dimensions (jax.export "
                  "shape polymorphism): the fast path needs sizes known at lowering")
  # The fused op has one kernel, on the one-shot exchange: the forced
  # algorithm and the tuning tables are the psum's; the default rule serves it.
  found = None
  if op == "psum" and groups and world >= 2:
    found = table_lookup.for_devices([d for g in groups for d in g], world)
    _log_default_rule(found, source)
  choice = policy.choose(
      dtype, nbytes, world, max_bytes=settings.max_bytes,
      table=found.table if found is not None else None,
      force=settings.forced() if op == "psum" else None,
      no_table=(found.note if found is not None
                else "the fused kernel exchanges as the one-shot does"))
  if choice.algorithm is None:
    return record(choice.reason, choice.detail)
  if found is not None and found.refusal is not None:
    return record("architecture", found.refusal)
  if shape_refusal is not None:
    return record("shape", shape_refusal)
  partial = _automatic_axes(axis_ctx)
  if partial:
    return record("partial_manual", (
        f"shard_map over only some mesh axes (automatic: {', '.join(partial)}): "
        "XLA would replicate the operand over the automatic axes around the "
        "call; lax.psum keeps it sharded"))
  candidate = choice.algorithm
  refusal = _refused_by_environment(groups, platform, for_export)
  if refusal is None and op != "psum":
    refusal = _refused_for_clusters(groups)
  if refusal is None:
    try:
      cs = comm.for_groups(groups)
      # The fused op runs on the one-shot's exchange, so on its region.
      cs.ensure(candidate)
    except comm.CommError as e:
      refusal = ("communicator", str(e))
    except Exception as e:  # pylint: disable=broad-except
      # Any other failure of creating the set or its scratch is a fallback
      # too, never a failed lowering: lax.psum, with the reason logged.
      text = str(e).strip().splitlines()
      refusal = ("communicator", "creating the communicator set failed: "
                 f"{type(e).__name__}: {text[0] if text else '(no message)'}")
  if refusal is not None:
    reason, detail = refusal
    return record(reason, detail + _on_nvlink_gpus(candidate, op),
                  candidate=candidate)
  return record("fast_path", choice.detail, algorithm=candidate,
                candidate=candidate, comm_id=cs.comm_id, comm_key=cs.key)
