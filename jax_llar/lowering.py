"""jax_llar's lowering of JAX's psum primitives: when a psum becomes the FFI call.

Importing jax_llar registers, for every platform, a lowering rule for
``psum_p`` and ``psum_invariant_p`` (the primitives that ``lax.psum``,
``lax.pmean`` and the transposes of ``pvary`` and ``psum`` bind) that wraps
the rule registered before it (JAX's own). A psum that nobody requested for
the fast path (``jax_llar.swap.requested``) goes straight to the wrapped
rule and is not recorded. For a requested psum, at lowering time, `decide`:
  1. gathers the facts per operand: dtype, bytes per rank, and, whenever
     the axis context holds a concrete mesh, the replica groups and so the
     number of ranks (JAX's own grouping, ``pxla.axis_groups``);
  2. asks the pure policy (``jax_llar.policy.choose``) which algorithm the
     psum itself calls for (psums with ``axis_index_groups`` or positional
     axes are JAX's), with the tuning table for the devices' architecture
     (their ``compute_capability``) and the number of ranks
     (``jax_llar.tuning.for_devices``; none: the default rule, said once in
     the log); devices of several architectures get lax.psum (reason
     "architecture");
  3. checks the environment, in this order: ``JAX_LLAR_DISABLE``; a lowering
     for ``jax.export``; XLA flags (concurrent command-buffer scheduling);
     the platform (lowering for CUDA alone, devices that are GPUs); one
     process driving every device of the groups; the extension
     (``jax_llar._ext``); a communicator set for the groups
     (``jax_llar.comm``).
Every decision on a requested psum is recorded (``jax_llar.dispatch_log()``),
and each reason not to take the fast path is logged once. A refusal by the
environment keeps the policy's choice as ``candidate``, so a decision taken
on CPU says what CUDA GPUs that are NVLink peers would run.

The fast path emits ``jax.ffi.ffi_lowering("jax_llar_all_reduce")`` with the
static attributes ``comm_id``, ``comm_key``, ``algorithm`` and ``signature``
(the call's signature, ``jax_llar.signature.assign``: a hash of the module,
the call's index in it, the op name and the call site; 0 with
``JAX_LLAR_SIGNATURES=0``), at a location whose name says jax_llar, the
algorithm, dtype, bytes and number of ranks (the op name XLA's metadata and
profiler traces show). Operands of one
psum equation that the policy refuses, and every other psum, lower through
the wrapped rule, so their HLO is JAX's.

Coexistence: a rule registered for these primitives before jax_llar is
imported is the one wrapped (and called for every psum jax_llar does not
take); one registered after replaces jax_llar's (``jax_llar.status()``
reports ``lowering_rules``). ``jax.export`` always gets the wrapped rule:
the fast path's communicator exists only in the process that lowered it.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from typing import Any, Sequence

import jax
import numpy as np
from jax._src import core
from jax._src import mesh as mesh_lib
from jax._src.interpreters import mlir, pxla
from jax._src.lax import parallel as lax_parallel
from jax._src.lib.mlir import ir
from jax._src.sharding_impls import SPMDAxisContext

from jax_llar import _ext, comm, distributed, log, policy, signature, swap, tuning
from jax_llar.algorithms import MAX_BYTES
from jax_llar.config import settings

# JAX's primitives that lax.psum, lax.pmean and the transposes of pvary and
# psum bind (jax 0.11 and 0.12).
PSUM_PRIMITIVES = (lax_parallel.psum_p, lax_parallel.psum_invariant_p)

# Reasons logged at INFO rather than WARNING: the user asked for them, or
# nothing is lost (so is "world_size" for a group of one device).
_INFO_REASONS = frozenset({"disabled", "empty", "export", "symbolic_shape"})

# Reasons that say the environment is broken: WARNING whoever asked.
_FAILURE_REASONS = frozenset({"xla_flags", "multiprocess", "extension",
                              "communicator"})

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
  if _spans_processes(devices) and distributed.store() is None:
    return ("multiprocess", "the replica groups span processes and "
            "jax.distributed is not initialised: call jax.distributed.initialize "
            "(its key-value store carries the communicators' ids)")
  if _ext.load() is None:
    return "extension", _ext.reason() or "extension unavailable"
  return None


def _spans_processes(devices) -> bool:
  """Whether the psum's devices belong to more than one process (or the
  program runs in several): then every process takes part in the set's
  creation (`comm.get_or_create_spanning`)."""
  return jax.process_count() > 1 or any(
      d.process_index != jax.process_index() for d in devices)


def _comm_set(groups) -> comm.CommSet:
  """The communicator set of `groups` (lists of jax devices, rank order)."""
  devices = [d for g in groups for d in g]
  if _spans_processes(devices):
    # Keyed by global device id: another process's device has no CUDA
    # ordinal here (its local_hardware_id is None), and the key must be the
    # same in every process.
    me = jax.process_index()
    architecture = tuning.architecture_of(devices[0])
    cs = comm.get_or_create_spanning(
        [[(d.process_index, d.id) for d in g] for g in groups], architecture,
        {d.id: d.local_hardware_id for d in devices if d.process_index == me})
    now = distributed.decision_inputs(len(groups[0]), architecture)
    if cs.agreed_inputs is not None and now != cs.agreed_inputs:
      changed = sorted(k for k in now if now.get(k) != cs.agreed_inputs.get(k))
      raise comm.CommError(
          f"this process's decision inputs changed since the processes agreed on them "
          f"({', '.join(changed)}): the others would decide differently; change "
          "settings in every process alike, before the first lowering")
    return cs
  return comm.get_or_create([[d.local_hardware_id for d in g] for g in groups])


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


def _log_default_rule(found: tuning.Lookup, source: str) -> None:
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
      info = reason in _INFO_REASONS or (reason == "world_size" and world < 2)
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
    found = tuning.for_devices([d for g in groups for d in g], world)
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
      cs = _comm_set(groups)
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


# --- the rules ----------------------------------------------------------------

_DTYPE_SHORT = {"bfloat16": "bf16", "float16": "f16", "float32": "f32",
                "float64": "f64"}


def op_name(decision: log.Decision) -> str:
  """The name a fast-path call carries in XLA's op metadata and in profiler
  traces: ``jax_llar.<algorithm>.<dtype>.<bytes per rank>B.<ranks>ranks``,
  e.g. ``jax_llar.one_shot_ll.bf16.1024B.2ranks``."""
  dtype = _DTYPE_SHORT.get(decision.dtype, decision.dtype)
  return (f"jax_llar.{decision.algorithm.short_name}.{dtype}."
          f"{decision.bytes_per_rank}B.{decision.world_size}ranks")


def _fast_path_call(ctx, x, decision: log.Decision):
  """The FFI call for one operand, at a location named by `op_name`, with
  the call's signature (``jax_llar.signature.assign``)."""
  name = op_name(decision)
  sig = signature.assign(ctx.module_context, name, ctx.traceback)
  loc = mlir.source_info_to_location(
      ctx.module_context, None, ctx.name_stack.extend(name), ctx.traceback)
  with ir.Location.name(f"jax_llar.{decision.algorithm.short_name}:",
                        childLoc=loc):
    return jax.ffi.ffi_lowering(_ext.TARGET_ALL_REDUCE)(
        ctx, x, comm_id=np.int64(decision.comm_id),
        comm_key=np.int64(decision.comm_key),
        algorithm=np.int64(int(decision.algorithm)), signature=np.int64(sig))


def _lower_requested(wrapped, platform: str, source: str, ctx, args, params):
  for_export = bool(getattr(ctx.module_context.lowering_parameters,
                            "for_export", False))
  decisions = [
      decide(ctx.module_context.axis_context, aval, params["axes"],
             platform=platform, source=source,
             axis_index_groups=params.get("axis_index_groups"),
             for_export=for_export)
      for aval in ctx.avals_in]
  fast = [i for i, d in enumerate(decisions) if d.fast]
  if not fast:
    return wrapped(ctx, *args, **params)
  outs: list[Any] = [None] * len(args)
  rest = [i for i in range(len(args)) if i not in fast]
  if rest:
    sub = ctx.replace(avals_in=[ctx.avals_in[i] for i in rest],
                      avals_out=[ctx.avals_out[i] for i in rest])
    for i, out in zip(rest, wrapped(sub, *[args[i] for i in rest], **params)):
      outs[i] = out
  for i in fast:
    sub = ctx.replace(avals_in=[ctx.avals_in[i]], avals_out=[ctx.avals_out[i]])
    (outs[i],) = _fast_path_call(sub, args[i], decisions[i])
  return outs


# The one platform whose lowering can emit the FFI call.
_FAST_PLATFORM = "cuda"


def _make_rule(prim, wrapped, platform: str | None):
  """jax_llar's rule for `prim` wrapping the rule `wrapped`: for every
  platform (`platform` None) or for one that JAX gives a rule of its own."""
  def rule(ctx, *args, **params):
    source = swap.requested(ctx.jaxpr_eqn_ctx)
    if source is None:
      return wrapped(ctx, *args, **params)
    platforms = ([platform] if platform is not None
                 else list(ctx.module_context.platforms))
    if len(platforms) == 1 or _FAST_PLATFORM not in platforms:
      return _lower_requested(wrapped, ", ".join(platforms), source, ctx,
                              args, params)
    # A lowering for several platforms at once: decide per platform, in one
    # branch for CUDA and one for the others, as JAX's per-platform rules do.
    others = ", ".join(p for p in platforms if p != _FAST_PLATFORM)
    return mlir.lower_per_platform(
        ctx.replace(avals_out=list(ctx.avals_out)), f"jax_llar {prim.name}",
        {_FAST_PLATFORM: functools.partial(_per_platform, wrapped,
                                           _FAST_PLATFORM, source, params)},
        functools.partial(_per_platform, wrapped, others, source, params),
        frozenset(), *args)

  rule.__name__ = rule.__qualname__ = (
      f"jax_llar_{prim.name}_lowering" + (f"_{platform}" if platform else ""))
  rule.wrapped = wrapped
  return rule


def _per_platform(wrapped, platform, source, params, ctx, *args):
  return _lower_requested(wrapped, platform, source, ctx, args, params)


_rules: dict[tuple[str, str | None], Any] = {}


def _register_rules() -> None:
  """Registers jax_llar's rule for each psum primitive, wrapping what is
  registered now: one for every platform, and one for each platform that
  JAX gives a rule of its own (none in jax 0.11 and 0.12). Lowerings of
  these primitives are not cached per module: the rule reads each
  equation's mark, name stack and axis context."""
  for prim in PSUM_PRIMITIVES:
    common = mlir._lowerings[prim]  # pylint: disable=protected-access
    specific = {p: t[prim] for p, t in mlir._platform_specific_lowerings.items()  # pylint: disable=protected-access
                if prim in t}
    for platform, entry in [(None, common), *specific.items()]:
      rule = _make_rule(prim, entry.rule, platform)
      mlir.register_lowering(prim, rule, platform=platform,
                             inline=entry.inline, cacheable=False)
      _rules[(prim.name, platform)] = rule


def rules_active() -> dict[str, bool]:
  """For each psum primitive (and platform with a rule of its own, as
  ``"name/platform"``), whether jax_llar's rule is still the one registered
  (False: code registered another rule after importing jax_llar)."""
  out = {}
  for (name, platform), rule in _rules.items():
    prim = next(p for p in PSUM_PRIMITIVES if p.name == name)
    if platform is None:
      entry = mlir._lowerings.get(prim)  # pylint: disable=protected-access
      out[name] = entry is not None and entry.rule is rule
    else:
      entry = mlir._platform_specific_lowerings[platform].get(prim)  # pylint: disable=protected-access
      out[f"{name}/{platform}"] = entry is not None and entry.rule is rule
  return out


_register_rules()
