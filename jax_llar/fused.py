"""``jax_llar.psum_add_rms_norm``: the all-reduce, the residual add and the
RMSNorm that follows it in a tensor-parallel transformer layer, as one op.

The op is defined by its reference, `reference`: the JAX code a model writes
without jax_llar's fused op, with the all-reduce through ``jax_llar.psum``.
Its primitive, ``psum_add_rms_norm_p``, keeps that reference as its
meaning: abstract evaluation (shapes, dtypes, ``check_vma`` types),
differentiation (under a JVP or linearize trace, i.e. ``jax.grad``,
``jax.jvp``, ``jax.vjp``, ``jax.jacfwd``, ``jax.hessian`` and their nestings,
an op whose inputs carry tangents is the reference itself, run under that
trace: the program differentiated is the unfused code's, equation for
equation, so every derivative order equals the reference's bitwise on CPU),
batching (each output batched where the reference's is: a batch of x or
residual is handed to the primitive on a leading dimension; a batched
weight, or a vmapped axis that the all-reduce names, runs the reference
under that vmap) and every lowering but the fast one are the reference's.

On CUDA the lowering asks ``jax_llar.dispatch.decide`` (with the fused
kernel's own shape rule, ``algorithms.add_rms_norm_refusal``, and its need
for thread block clusters) and emits the fused kernel's FFI call, one launch
doing all three steps as TensorRT-LLM, vLLM and FlashInfer fuse them
(ffi/src/kernels/one_shot_ll_add_rms_norm.cuh). Where the decision refuses
on CUDA, the op lowers to the reference, whose psum goes through jax_llar's
dispatch as any ``jax_llar.psum`` does (it may still take a fast path, e.g.
the one-shot for a shape the fused kernel does not serve) and is recorded
as a decision of its own. On every other platform the op lowers to the
reference with a plain ``lax.psum``: jax_llar's psum rule could only refuse
there and lower it as ``lax.psum`` does, so the program is the same, and the
dispatch log holds one decision per fused op. The fused op's decision is
recorded with ``op="psum_add_rms_norm"``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax._src import api_util, core
from jax._src.interpreters import ad, batching, mlir
from jax._src.interpreters import partial_eval as pe
import jax.extend.linear_util as lu
import numpy as np

from jax_llar import algorithms, dispatch, log, lowering, swap
from jax_llar import psum as psum_lib


def reference(x, residual, weight, axis_name, eps: float = 1e-6):
  """The meaning of `psum_add_rms_norm`: the unfused JAX code.

  new_residual = jax_llar.psum(x, axis_name) + residual, in x's dtype (each
  step rounded to it, as XLA rounds each operation); normed = new_residual
  times rsqrt(mean(new_residual^2 over the last axis) + eps) times weight,
  computed in float32 and rounded once to x's dtype.
  """
  return _reference(psum_lib.psum, x, residual, weight, axis_name, eps)


def _reference(psum, x, residual, weight, axis_name, eps: float):
  """`reference` with the all-reduce `psum` (``jax_llar.psum``, or
  `_jax_psum` where jax_llar has nothing to decide)."""
  new_residual = psum(x, axis_name) + residual
  return _norm(new_residual, weight, eps), new_residual


def _jax_psum(x, axis_name):
  """``lax.psum`` marked to stay JAX's (``swap_psum(False)``'s mark, which
  also holds under ``install()``): jax_llar's rule lowers it as JAX does and
  records no decision for it."""
  with swap.mark(swap.MARK_OFF):
    return lax.psum(x, axis_name)


def _norm(new_residual, weight, eps: float):
  """The RMSNorm half of `reference`."""
  h = new_residual.astype(jnp.float32)
  inv = lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + jnp.float32(eps))
  return (h * inv * weight.astype(jnp.float32)).astype(new_residual.dtype)


def psum_add_rms_norm(x: Any, residual: Any, weight: Any, axis_name, *,
                      eps: float = 1e-6) -> tuple[Any, Any]:
  """All-reduce `x` over `axis_name`, add `residual`, and RMS-normalise.

  The step that ends a tensor-parallel attention or MLP block: the partial
  outputs of the ranks are summed, the sum is added to the residual stream,
  and the next block's RMSNorm is applied to the result. Same results as
  `reference` (the unfused code): ``new_residual`` bitwise, ``normed``
  within one unit in the last place of x's dtype (the fused kernel sums the
  squares in another order than XLA's reduction; float32 within 4 ulp, as
  the kernel also rounds new_residual before normalising where XLA may keep
  float32; benchmarks/NOTES.md records what the loopback measured). Where
  the fused kernel does
  not serve the op it is the reference, bitwise.

  Differentiation: every derivative order equals the unfused reference's
  bitwise on CPU (``jax.grad``, ``jax.vjp``, ``jax.jvp``, ``jax.linearize``,
  ``jax.jacfwd``, ``jax.jacrev``, ``jax.hessian`` and any nesting of them,
  with respect to x, residual and weight): under differentiation the op is
  its reference, so the program differentiated is the unfused code's,
  equation for equation. So a differentiated program holds no fused op: its
  forward pass is the reference's, whose all-reduce is a ``jax_llar.psum``
  with a dispatch decision of its own (op "psum"; on CUDA GPUs it may take
  the one-shot fast path, not the fused kernel). An op whose inputs carry no
  tangent stays the fused op.

  Batching (``jax.vmap``, any combination of batched x, residual and
  weight): each output is batched where the reference's is, and an output
  that the batch does not reach is unbatched (``out_axes=None`` takes it):
  new_residual is not batched by a batched weight alone, and an all-reduce
  over the vmapped axis itself sums the batch. A batch of x or residual runs
  the fused op on a leading batch dimension; a batched weight, or a vmapped
  axis that the all-reduce names, runs the reference under that vmap.

  Args:
    x: the rank's partial sum, shape (..., d), float32, bfloat16 or float16,
      varying over `axis_name` (inside ``jax.shard_map``).
    residual: the residual stream, the shape and dtype of `x`.
    weight: the RMSNorm gain, shape (d,), any float dtype (used in float32).
    axis_name: mesh axis name (or tuple of names) of the all-reduce.
    eps: added to the mean square before the reciprocal square root; a
      static Python number (it is part of the compiled call): not a traced
      value such as an argument of a jitted function.

  Returns:
    (normed, new_residual), both with x's shape and dtype.

  Not yet like the unfused code: ``checkify`` does not look inside the op
  (it reports no NaN the op produces), and a psum of a pytree is one op per
  leaf.

  Raises:
    ValueError: shapes or dtypes that do not match (before any lowering).
    TypeError: an eps that is not a static Python number ("eps must be a
      static Python float"), e.g. a traced one: pass a Python float, or mark
      the argument it comes from static (``jax.jit(...,
      static_argnames=...)``).
    NameError: an unbound axis name (JAX's error, from the psum).

  Example, inside a jitted shard_map over a mesh with axis "tp"::

    h, resid = jax_llar.psum_add_rms_norm(attn_out_partial, resid, ln2_w, "tp")

  Source: the fused all-reduce + residual + RMSNorm of the serving engines
  (TensorRT-LLM, vLLM, FlashInfer); the all-reduce of arXiv 2607.16100.
  """
  x, residual, weight = (jnp.asarray(v) for v in (x, residual, weight))
  if x.shape != residual.shape or x.dtype != residual.dtype:
    raise ValueError(f"psum_add_rms_norm: x {x.dtype}{list(x.shape)} and residual "
                     f"{residual.dtype}{list(residual.shape)} must have one shape "
                     "and dtype")
  if x.ndim < 1:
    raise ValueError("psum_add_rms_norm: x needs at least one dimension (the "
                     "normalised one)")
  if weight.shape != x.shape[-1:]:
    raise ValueError(f"psum_add_rms_norm: weight must have shape {x.shape[-1:]} "
                     f"(the last dimension of x), got {weight.shape}")
  if not jnp.issubdtype(x.dtype, jnp.floating) or not jnp.issubdtype(
      weight.dtype, jnp.floating):
    raise ValueError(f"psum_add_rms_norm: float dtypes only, got x {x.dtype} "
                     f"and weight {weight.dtype}")
  axes = tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)
  normed, new_residual = psum_add_rms_norm_p.bind(x, residual, weight, axes=axes,
                                                  eps=_static_eps(eps))
  return normed, new_residual


def _static_eps(eps) -> float:
  """`eps` as the Python float the op compiles in, or a TypeError naming it
  (a traced value, e.g. a jitted function's argument, has no value yet)."""
  if isinstance(eps, core.Tracer):
    raise TypeError(
        f"psum_add_rms_norm: eps must be a static Python float (it is compiled "
        f"into the op), got a traced value ({core.typeof(eps).str_short()}); pass "
        "a Python number, or mark the argument it comes from static (e.g. "
        "jax.jit(..., static_argnames=...))")
  try:
    return float(eps)
  except (TypeError, ValueError) as e:
    raise TypeError(f"psum_add_rms_norm: eps must be a static Python float, got "
                    f"{eps!r}") from e


# --- the primitive ---------------------------------------------------------------

class _FusedPrimitive(core.Primitive):
  """A primitive that differentiation traces do not see: bound under a JVP
  or linearize trace (``jax.jvp``, ``jax.grad``, ``jax.vjp``,
  ``jax.linearize``, ``jax.jacfwd``, ``jax.hessian``, ...) with an input that
  carries a tangent there, it is its reference, run under that very trace.

  So the program a transformation differentiates is the unfused code's own,
  equation for equation, and every derivative order is the reference's. A
  JVP rule, even one of the reference's arithmetic, orders its equations
  otherwise, which XLA may compile to other bits at higher orders
  (benchmarks/NOTES.md). Every other trace (jit and make_jaxpr staging,
  vmap, evaluation) binds the primitive."""

  def bind_with_trace(self, trace, args, *rest):
    # rest: (avals, params) on this jax, (params,) on older ones.
    if (isinstance(trace, _DIFFERENTIATION_TRACES) and
        any(not _is_zero(trace.to_primal_tangent_pair(a)[1]) for a in args)):
      params = rest[-1]
      with core.set_current_trace(trace):
        return list(_ref(params["axes"], params["eps"])(*args))
    return super().bind_with_trace(trace, args, *rest)


_DIFFERENTIATION_TRACES = tuple(
    t for t in (getattr(ad, "JVPTrace", None), getattr(ad, "LinearizeTrace", None))
    if t is not None)


# The fused kernel's name in its calls' op names (``lowering.op_name``).
KERNEL = "one_shot_ll_add_rms_norm"

# The fused op's JAX primitive (llar_psum_add_rms_norm in a jaxpr), bound by
# `psum_add_rms_norm`; two results (normed, new_residual); lowered by `_lower`.
psum_add_rms_norm_p = _FusedPrimitive("llar_psum_add_rms_norm")
psum_add_rms_norm_p.multiple_results = True


def _is_zero(t) -> bool:
  return type(t) is ad.Zero


def _ref(axes, eps, psum=psum_lib.psum):
  return lambda x, r, w: _reference(psum, x, r, w, axes, eps)


def _abstract_eval(x, residual, weight, *, axes, eps):
  fn = _ref(axes, eps)
  dbg = api_util.debug_info("jax_llar.psum_add_rms_norm", fn,
                            (x, residual, weight), {})
  jaxpr, outs, _ = pe.trace_to_jaxpr_dynamic(lu.wrap_init(fn, debug_info=dbg),
                                             [x, residual, weight])
  return outs, jaxpr.effects


def _impl(x, residual, weight, *, axes, eps):
  return _ref(axes, eps)(x, residual, weight)


def _jvp(primals, tangents, *, axes, eps):
  """The reference's JVP (for a caller that asks for the rule itself:
  `_FusedPrimitive` runs the reference under the JVP and linearize traces,
  so that they do not), with symbolic zeros kept symbolic: an input without
  a tangent is a constant of the JVP, as in the unfused code."""
  return _jvp_of(_ref(axes, eps), primals, tangents)


def _jvp_of(fn, primals, tangents):
  """``jax.jvp(fn, primals, tangents)`` where a tangent may be a symbolic
  zero (``ad.Zero``): that argument is closed over. Returns (outs, tangents)
  as lists, a tangent a symbolic zero where no argument has one."""
  nonzero = [not _is_zero(t) for t in tangents]

  def of_nonzero(*args):
    it = iter(args)
    return fn(*(next(it) if nz else p for p, nz in zip(primals, nonzero)))

  if not any(nonzero):
    outs = fn(*primals)
    return list(outs), [ad.Zero(core.typeof(o).to_tangent_aval()) for o in outs]
  outs, touts = jax.jvp(of_nonzero, [p for p, nz in zip(primals, nonzero) if nz],
                        [t for t, nz in zip(tangents, nonzero) if nz])
  return list(outs), list(touts)


def _batch(axis_data, vals, dims, *, axes, eps):
  """Batching: each output batched exactly where the reference's is.

  Nothing batched (vmap calls the rule then too, e.g. for the primal of
  ``jax.jacfwd``): the op, unbatched. The vmapped axis is one the
  all-reduce names, or each batch element has a gain of its own: the
  reference, batched by JAX with its own out axes (an output the batch does
  not reach stays unbatched). Else x or residual batched: the op on a
  leading batch dimension (the other moved or broadcast there); both
  outputs depend on both, so both are batched."""
  x, r, w = vals
  dx, dr, dw = dims
  if axis_data.name in axes or dw is not None:
    fn = _ref(axes, eps)
    dbg = api_util.debug_info("jax_llar.psum_add_rms_norm", fn, (x, r, w), {})
    f, out_dims = batching.batch_subtrace(lu.wrap_init(fn, debug_info=dbg),
                                          core.TraceTag(), axis_data, tuple(dims))
    out = f.call_wrapped(x, r, w)
    return list(out), list(out_dims())
  if dx is None and dr is None:
    return psum_add_rms_norm_p.bind(x, r, w, axes=axes, eps=eps), [None, None]
  size, mesh_axis = axis_data.size, axis_data.explicit_mesh_axis
  x = batching.bdim_at_front(x, dx, size, mesh_axis)
  r = batching.bdim_at_front(r, dr, size, mesh_axis)
  return psum_add_rms_norm_p.bind(x, r, w, axes=axes, eps=eps), [0, 0]


psum_add_rms_norm_p.def_effectful_abstract_eval(_abstract_eval)
psum_add_rms_norm_p.def_impl(_impl)
ad.primitive_jvps[psum_add_rms_norm_p] = _jvp
batching.fancy_primitive_batchers[psum_add_rms_norm_p] = _batch


def lower_reference(ctx, x, residual, weight, *, axes, eps, decide_psum: bool = True):
  """The op's lowering where no fused kernel serves it: the reference.

  Args:
    decide_psum: True: the reference's psum is ``jax_llar.psum``, decided
      (and recorded in the dispatch log) by jax_llar's psum rule, which may
      give it a fast path (CUDA). False: it is ``lax.psum``, left to JAX and
      not recorded; the same program wherever jax_llar's psum rule can only
      refuse (every platform but CUDA).
  """
  fn = _ref(axes, eps, psum_lib.psum if decide_psum else _jax_psum)
  return mlir.lower_fun(fn, multiple_results=True)(ctx, x, residual, weight)


def _decide(ctx, axes, platform: str) -> log.Decision:
  x_aval, _, w_aval = ctx.avals_in
  refusal = None
  if core.is_constant_shape(x_aval.shape):  # else decide() refuses it first
    refusal = algorithms.add_rms_norm_refusal(x_aval.shape, x_aval.dtype, w_aval.dtype)
  for_export = bool(getattr(ctx.module_context.lowering_parameters, "for_export",
                            False))
  return dispatch.decide(ctx.module_context.axis_context, x_aval, axes,
                         platform=platform, source="psum", for_export=for_export,
                         op="psum_add_rms_norm", shape_refusal=refusal)


def _lower_default(ctx, platforms: str, x, residual, weight, *, axes, eps):
  """Every platform but CUDA: records what CUDA GPUs would do (the fused
  kernel's candidate, or why not), then lowers the reference with lax.psum.
  That one decision is the op's only one: jax_llar's psum rule would refuse
  the reference's psum here too ("platform", or an earlier reason) and lower
  it as lax.psum, so it is not asked (a second decision for one op)."""
  _decide(ctx, axes, platforms or "this platform")
  return lower_reference(ctx, x, residual, weight, axes=axes, eps=eps,
                         decide_psum=False)


def _lower_cuda(ctx, x, residual, weight, *, axes, eps):
  """CUDA: the fused kernel where `decide` allows it, else the reference,
  whose psum jax_llar decides (and records) as any jax_llar.psum: it may
  take a fast path that the fused kernel could not (another shape rule, no
  thread block clusters, a tuning table's algorithm). The fused call has a
  signature of its own: it shares the one-shot's epochs and scratch, so a
  mispairing with a one-shot call is detected too."""
  decision = _decide(ctx, axes, "cuda")
  if not decision.fast or decision.algorithm != algorithms.Algorithm.ONE_SHOT_LL:
    return lower_reference(ctx, x, residual, weight, axes=axes, eps=eps)
  return lowering.emit_call(ctx, [x, residual, weight], decision,
                            algorithms.FUSED_TARGET, kernel=KERNEL, eps=np.float32(eps))


def _lower(ctx, x, residual, weight, *, axes, eps):
  """The one rule for every platform: CUDA's or the others', one branch each
  for a lowering for several platforms at once
  (``lowering.lower_for_platforms``, as the psum rules)."""
  def rule(c, platforms, *args):
    if platforms == lowering.FAST_PLATFORM:
      return _lower_cuda(c, *args, axes=axes, eps=eps)
    return _lower_default(c, platforms, *args, axes=axes, eps=eps)
  return lowering.lower_for_platforms(ctx, "jax_llar psum_add_rms_norm", rule,
                                      x, residual, weight)


# Not cached per module: every fused call gets an instruction, and so a call
# signature, of its own (as the psum rules, jax_llar.lowering).
mlir.register_lowering(psum_add_rms_norm_p, _lower, cacheable=False)
