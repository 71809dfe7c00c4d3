"""The decode step's MLP (gate and up, SiLU, down) as one Pallas kernel: an
experiment of issue 27 (benchmarks/NOTES.md entries 78-79), not a step form.

A step that runs each product as a kernel of its own pays each product's fixed
cost (the ramp and drain of a kernel; benchmarks/NOTES.md entries 77-78). Here
the down product joins the gate/up product's kernel by splitting its
contraction: program j owns `rows` rows of the MLP width F; it forms its rows
of m = silu(gate) * up exactly as ``matvec.matvec(glu=True)`` does (the input
row read in chunks, float32 sums, the residual add and RMSNorm's factor folded
in) and then adds its share of the down product, m_j times rows_j of W_down^T,
into the float32 output with atomic adds. W_down is taken transposed, (F, D),
so that a program reads whole rows of it.

The output is the float32 sum over the programs' shares, added in the order
the programs reach the atomics: it can differ in its last bits from run to run
(the model rounds it to bfloat16 next); the kernel adds into a zeroed buffer
made for each call and aliased to its output. On GPUs Pallas's Triton backend
compiles it (its blocks are (rows, D): D must be a power of two there);
elsewhere it runs in Pallas's interpreter.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

import matvec  # this folder's: the gate/up rows as its glu kernel forms them


def _kernel(*refs, d: int, rows: int, chunk: int, residual: bool, norm: bool,
            eps: float):
  """Program (i, j): input row i, MLP rows [j * rows, (j + 1) * rows).
  refs: x (D,), [residual (D,)], gate (rows, D), up (rows, D), wd (rows, D),
  acc (D,) (aliased to the output), out (D,), [x + residual (D,)]."""
  it = iter(refs)
  x_ref = next(it)
  r_ref = next(it) if residual else None
  g_ref, u_ref, wd_ref = next(it), next(it), next(it)
  next(it)  # acc: the output's buffer, read through o_ref
  o_ref = next(it)
  xs_ref = next(it) if residual else None
  f32 = jnp.float32

  def store_xs(cols, xb):
    @pl.when(pl.program_id(1) == 0)
    def _():
      xs_ref[cols] = xb

  m = matvec.glu_rows(lambda cols: x_ref[cols],
                      (lambda cols: r_ref[cols]) if residual else None, store_xs,
                      lambda cols: g_ref[:, cols], lambda cols: u_ref[:, cols], k=d,
                      chunk=chunk, rows=rows, norm=norm, eps=eps,
                      xs_dtype=xs_ref.dtype if residual else None)
  m = m.astype(jnp.bfloat16).astype(f32)
  for c in range(d // chunk):
    cols = pl.ds(c * chunk, chunk)
    share = jnp.sum(wd_ref[:, cols].astype(f32) * m[:, None], 0)
    plgpu.atomic_add(o_ref, cols, share)


def mlp(x: jax.Array, wgu: jax.Array, wd_t: jax.Array, *,
        residual: jax.Array | None = None, norm_eps: float | None = None,
        rows: int = 32, chunk: int = 256, warps: int = 8, interpret: bool = False):
  """down(silu(gate x) * up x) for each row of x, in one kernel.

  Args:
    x: (M, D) input rows, bfloat16 (or float32, taken as it is).
    wgu: (2F, D) bfloat16, [gate; up], contracting-minor (``model``'s layout).
    wd_t: (F, D) bfloat16, W_down transposed (``model`` keeps W_down (D, F)).
    residual: None or (M, D) bfloat16: the input is x + residual rounded to
      bfloat16, returned as well (the residual add after an all-reduce).
    norm_eps: None, or RMSNorm's epsilon: the gate and up products are scaled
      by the input row's rsqrt(mean(x^2) + eps) (after their rounding to
      bfloat16, as ``matvec.matvec(round_first=True)``).
    rows: MLP rows a program (a power of two dividing F); each program makes
      D atomic adds, so F / rows x D in all.
    chunk: columns a step (a power of two dividing D).
    warps: warps a program.
    interpret: run in Pallas's interpreter (no GPU).

  Returns:
    y (M, D) float32 (the down product, before its rounding to bfloat16);
    with residual, (y, x + residual).

  Raises:
    ValueError: shapes that do not match, weights that are not bfloat16, or
      rows / chunk that are not powers of two dividing F / D.

  Example (the MLP of one row after the attention's all-reduce)::

    y, x = mlp(x, wgu, wdown.T, residual=attn_out, norm_eps=1e-5)
  """
  m, d = x.shape
  f2, d2 = wgu.shape
  f = f2 // 2
  if rows < 1 or chunk < 1 or wgu.dtype != jnp.bfloat16 or wd_t.dtype != jnp.bfloat16:
    raise ValueError(f"mlp: rows {rows} and chunk {chunk} must be positive, wgu and wd_t "
                     f"bfloat16 (are {wgu.dtype}, {wd_t.dtype})")
  if (d2 != d or f2 % 2 or wd_t.shape != (f, d)
      or (residual is not None and residual.shape != x.shape)
      or f % rows or d % chunk or rows & (rows - 1) or chunk & (chunk - 1)):
    raise ValueError(f"mlp: x {x.shape}, wgu {wgu.shape}, wd_t {wd_t.shape}, residual "
                     f"{None if residual is None else residual.shape}, rows {rows} and "
                     f"chunk {chunk} do not match")
  blocks = f // rows
  row = pl.BlockSpec((None, d), lambda i, j: (i, 0))
  in_specs = [row] + ([row] if residual is not None else [])
  in_specs += [pl.BlockSpec((rows, d), lambda i, j: (j, 0)),
               pl.BlockSpec((rows, d), lambda i, j: (blocks + j, 0)),
               pl.BlockSpec((rows, d), lambda i, j: (j, 0)), row]
  out_specs = [row]
  out_shape = [jax.ShapeDtypeStruct((m, d), jnp.float32)]
  if residual is not None:
    out_specs.append(row)
    out_shape.append(jax.ShapeDtypeStruct((m, d), x.dtype))
  args = [x] + ([residual] if residual is not None else []) + [wgu, wgu, wd_t,
                                                             jnp.zeros((m, d), jnp.float32)]
  kernel = functools.partial(_kernel, d=d, rows=rows, chunk=chunk,
                             residual=residual is not None, norm=norm_eps is not None,
                             eps=float(norm_eps or 0.0))
  out = pl.pallas_call(
      kernel, grid=(m, blocks), in_specs=in_specs, out_specs=out_specs, out_shape=out_shape,
      input_output_aliases={len(args) - 1: 0},
      compiler_params=plgpu.CompilerParams(num_warps=warps, num_stages=1),
      interpret=interpret, name="mlp")(*args)
  return (out[0], out[1]) if residual is not None else out[0]
