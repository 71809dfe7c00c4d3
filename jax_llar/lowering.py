"""jax_llar's lowering of JAX's psum primitives, and the FFI call it emits.

Importing jax_llar registers, for every platform, a lowering rule for
``psum_p`` and ``psum_invariant_p`` (the primitives that ``lax.psum``,
``lax.pmean`` and the transposes of ``pvary`` and ``psum`` bind) that wraps
the rule registered before it (JAX's own). A psum that nobody requested for
the fast path (``jax_llar.swap.requested``) goes straight to the wrapped
rule and is not recorded. For a requested psum the rule asks
``jax_llar.dispatch.decide`` per operand (which records the decision and
makes the communicators), and emits what it says: the fast path's FFI call
(`emit_call`) for the operands it serves, the wrapped rule for the rest.

The fast path emits ``jax.ffi.ffi_lowering("jax_llar_all_reduce")`` with the
static attributes ``comm_id``, ``comm_key``, ``algorithm`` and ``signature``
(the call's signature, ``jax_llar.signature.assign``: a hash of the module,
the call's index in it, the op name and the call site; 0 with
``JAX_LLAR_SIGNATURES=0``), at a location whose name says jax_llar, the
algorithm, dtype, bytes and number of ranks (`op_name`: what XLA's metadata
and profiler traces show). The fused op (``jax_llar.fused``) emits its own
target through the same `emit_call`, and splits a lowering for several
platforms with the same `lower_for_platforms`.

Coexistence: a rule registered for these primitives before jax_llar is
imported is the one wrapped (and called for every psum jax_llar does not
take); one registered after replaces jax_llar's (``jax_llar.status()``
reports ``lowering_rules``). ``jax.export`` always gets the wrapped rule
(``dispatch.decide`` refuses it: the fast path's communicator exists only in
the process that lowered it).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import jax
import numpy as np
from jax._src.interpreters import mlir
from jax._src.lax import parallel as lax_parallel
from jax._src.lib.mlir import ir

from jax_llar import _ext, dispatch, log, signature, swap

# JAX's primitives that lax.psum, lax.pmean and the transposes of pvary and
# psum bind (jax 0.11 and 0.12).
PSUM_PRIMITIVES = (lax_parallel.psum_p, lax_parallel.psum_invariant_p)

# The one platform whose lowering can emit the FFI call.
FAST_PLATFORM = "cuda"

_DTYPE_SHORT = {"bfloat16": "bf16", "float16": "f16", "float32": "f32",
                "float64": "f64"}


def op_name(decision: log.Decision, kernel: str | None = None) -> str:
  """The name a fast-path call carries in XLA's op metadata and in profiler
  traces: ``jax_llar.<kernel>.<dtype>.<bytes per rank>B.<ranks>ranks``, e.g.
  ``jax_llar.one_shot_ll.bf16.1024B.2ranks``; `kernel` defaults to the
  decision's algorithm (the fused op names its own kernel)."""
  dtype = _DTYPE_SHORT.get(decision.dtype, decision.dtype)
  kernel = kernel or decision.algorithm.short_name
  return f"jax_llar.{kernel}.{dtype}.{decision.bytes_per_rank}B.{decision.world_size}ranks"


def emit_call(ctx, operands: Sequence[Any], decision: log.Decision, target: str,
              kernel: str | None = None, **attributes) -> Sequence[Any]:
  """The FFI call of `target` on `operands` for a fast-path `decision`: the
  attributes ``comm_id``, ``comm_key`` and ``signature`` (a signature of its
  own, ``jax_llar.signature.assign``) plus `attributes`, at a location named
  `op_name` (``jax_llar.<kernel>:`` around the call site), and the
  frontend attribute `BUILD_ATTRIBUTE` naming the extension's build.
  Returns the call's results."""
  name = op_name(decision, kernel)
  sig = signature.assign(ctx.module_context, name, ctx.traceback)
  loc = mlir.source_info_to_location(
      ctx.module_context, None, ctx.name_stack.extend(name), ctx.traceback)
  with ir.Location.name(f"jax_llar.{kernel or decision.algorithm.short_name}:",
                        childLoc=loc):
    results = jax.ffi.ffi_lowering(target)(
        ctx, *operands, comm_id=np.int64(decision.comm_id),
        comm_key=np.int64(decision.comm_key), signature=np.int64(sig), **attributes)
  identity = _ext.build_identity()
  if identity is not None and results:
    _add_frontend_attribute(_owner(results[0]), BUILD_ATTRIBUTE, identity)
  return results


# The frontend attribute of every fast-path call that names the extension's
# build (``jax_llar._ext.build_identity``): part of the program, so of every
# compilation cache's key, and ignored by XLA and by the FFI handler.
BUILD_ATTRIBUTE = "jax_llar_build"


def _owner(value):
  owner = value.owner
  return owner.operation if hasattr(owner, "operation") else owner


def _add_frontend_attribute(op, name: str, value: str) -> None:
  """Adds ``name = value`` to `op`'s ``mhlo.frontend_attributes``, keeping
  the attributes it has (as JAX adds its own)."""
  attrs = {name: ir.StringAttr.get(value)}
  existing = op.attributes["mhlo.frontend_attributes"] if (
      "mhlo.frontend_attributes" in op.attributes) else None
  if existing is not None:
    attrs |= {a.name: a.attr for a in ir.DictAttr(existing)}
  op.attributes["mhlo.frontend_attributes"] = ir.DictAttr.get(attrs)


def lower_for_platforms(ctx, description: str, rule: Callable, *args):
  """``rule(ctx, platforms, *args)`` for the lowering's platforms
  (`platforms` the names joined by ", "): once, for one platform or several
  without CUDA; for several with CUDA one branch for CUDA and one for the
  others, as JAX's per-platform rules do (``mlir.lower_per_platform``, which
  for a rule that is not cached needs a list of output avals)."""
  platforms = list(ctx.module_context.platforms)
  if len(platforms) == 1 or FAST_PLATFORM not in platforms:
    return rule(ctx, ", ".join(platforms), *args)
  others = ", ".join(p for p in platforms if p != FAST_PLATFORM)
  return mlir.lower_per_platform(
      ctx.replace(avals_out=list(ctx.avals_out)), description,
      {FAST_PLATFORM: lambda c, *a: rule(c, FAST_PLATFORM, *a)},
      lambda c, *a: rule(c, others, *a), frozenset(), *args)


def _lower_requested(wrapped, source: str, params, ctx, platform: str, *args):
  for_export = bool(getattr(ctx.module_context.lowering_parameters,
                            "for_export", False))
  decisions = [
      dispatch.decide(ctx.module_context.axis_context, aval, params["axes"],
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
    (outs[i],) = emit_call(sub, [args[i]], decisions[i], _ext.TARGET_ALL_REDUCE,
                           algorithm=np.int64(int(decisions[i].algorithm)))
  return outs


def _make_rule(prim, wrapped, platform: str | None):
  """jax_llar's rule for `prim` wrapping the rule `wrapped`: for every
  platform (`platform` None) or for one that JAX gives a rule of its own."""
  def rule(ctx, *args, **params):
    source = swap.requested(ctx.jaxpr_eqn_ctx)
    if source is None:
      return wrapped(ctx, *args, **params)
    lower = functools.partial(_lower_requested, wrapped, source, params)
    if platform is not None:
      return lower(ctx, platform, *args)
    return lower_for_platforms(ctx, f"jax_llar {prim.name}", lower, *args)

  rule.__name__ = rule.__qualname__ = (
      f"jax_llar_{prim.name}_lowering" + (f"_{platform}" if platform else ""))
  rule.wrapped = wrapped
  return rule


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
