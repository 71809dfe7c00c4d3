"""Matrix-vector products of the decode step as one Pallas kernel each (the
step form ``model.Step(mv="pallas")``), with the work around them folded in.

A product ``y = w x`` reads each weight row once: w is (N, K) bfloat16,
stored contracting-minor (``model``'s layout), x is one row of K. Each
program of the grid owns `rows` consecutive output rows and reads its
(rows, K) block in chunks of `chunk` columns, keeping float32 partial sums
per column and summing them once at the end. What the step would otherwise
run as kernels of their own is done in the product's prologue or epilogue,
on data the program holds anyway:

- ``residual``: the input is ``x + residual`` rounded to bfloat16 (the
  residual add after an all-reduce; the model adds in bfloat16); every
  program forms it from the two rows it reads, and the programs of the first
  column of the grid write it out, so the next layer gets its residual
  stream without another kernel.
- ``norm``: RMSNorm's factor rsqrt(mean(x^2) + eps) of the input row,
  computed by every program from the row it reads, scales the output (the
  gain is folded into w, as ``model`` does).
- ``glu``: w is [gate; up] (2F, K) and the output is silu(gate) * up (F,)
  rounded to bfloat16: the program reads the matching rows of both halves.
- ``round_first``: the product is rounded to bfloat16 before the factor is
  applied (the model's order for its Q, K, V and MLP products); the LM
  head's logits are not.

The arithmetic is float32 from bfloat16 operands, as ``model._mv``; the order
of summation differs (per-column partial sums, then a tree across them), so
outputs agree with the other forms to float32 rounding before the last
bfloat16 rounding, not bit for bit.

The method is the plain row-blocked matrix-vector product of memory-bound
decoding (each weight byte read once, no reuse to tile for); what it adds is
the fusion above. On GPUs Pallas's Triton backend compiles it; elsewhere it runs in Pallas's
interpreter (``interpret``), for tests of its arithmetic. The tile
(`rows`, `chunk`, warps) comes from `tile` unless given; its rules and what
they were chosen from are in benchmarks/NOTES.md (matvec_bench.py measures
them).
"""

from __future__ import annotations

import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu


@dataclasses.dataclass(frozen=True)
class Tile:
  """A program's share: `rows` output rows (a power of two), read `chunk`
  columns a step (a power of two dividing K), by `warps` warps; `stages` 0
  unrolls the steps (straight-line code: the compiler may issue every
  step's loads at once), n >= 1 makes them a loop that Triton pipelines
  n deep."""
  rows: int
  chunk: int
  warps: int = 4
  stages: int = 0


# Tiles measured best per (N, K, glu) on one H200 (matvec_bench.py; the
# results file is named in benchmarks/NOTES.md); `tile` falls back to its
# rules for other shapes. MATVEC_TILES=<json file> (matvec_bench.py
# --best_out) replaces the table.
TILES: dict[tuple[int, int, bool], Tile] = {
    # One TP=2 shard of Llama-3.2-1B: qkv, o, [gate; up], down, LM head.
    (1536, 2048, False): Tile(2, 1024, 4, 3),
    (2048, 1024, False): Tile(2, 1024, 4),
    (4096, 2048, True): Tile(4, 2048, 4),
    (2048, 4096, False): Tile(2, 2048, 4),
    (64128, 2048, False): Tile(4, 2048, 4),
    # One TP=2 shard of Llama-3-8B.
    (3072, 4096, False): Tile(8, 1024, 4),
    (4096, 2048, False): Tile(1, 2048, 4),
    (7168, 4096, True): Tile(2, 2048, 4),
    (4096, 7168, False): Tile(4, 512, 4),
    (64128, 4096, False): Tile(4, 2048, 8),
}


def load_tiles(path: str) -> dict[tuple[int, int, bool], Tile]:
  """{"N,K,glu": [rows, chunk, warps, stages]} from `path` as TILES' keys."""
  import json
  with open(path) as f:
    raw = json.load(f)
  out = {}
  for key, v in raw.items():
    n, k, glu = key.split(",")
    out[(int(n), int(k), glu == "True")] = Tile(*v)
  return out


if os.environ.get("MATVEC_TILES"):
  TILES = load_tiles(os.environ["MATVEC_TILES"])


# Programs a product aims at: enough that every one of H200's 132
# multiprocessors holds several programs' loads in flight.
TARGET_PROGRAMS = 1024
# A program's float32 partial sums (rows x chunk, twice that with glu) are
# kept within this many elements: 32 registers a thread at 4 warps.
ACC_ELEMENTS = 4096


def _pow2_floor(n: int) -> int:
  return 1 << (max(1, n).bit_length() - 1)


def tile(n: int, k: int, glu: bool = False) -> Tile:
  """The default tile for an (n, k) product (n output rows; with glu, n is F,
  each half's rows): as many rows as keep about TARGET_PROGRAMS programs
  (at least 1, a power of two dividing n), and the widest chunk dividing k
  that keeps the partial sums within ACC_ELEMENTS; a shape in TILES takes
  its measured tile."""
  if (n, k, glu) in TILES:
    return TILES[(n, k, glu)]
  rows = 1
  while n % (rows * 2) == 0 and n // (rows * 2) >= TARGET_PROGRAMS:
    rows *= 2
  acc = ACC_ELEMENTS // (2 if glu else 1)
  chunk = _pow2_floor(min(k, max(1, acc // rows)))
  while k % chunk:
    chunk //= 2
  return Tile(rows, chunk, 4)


def _kernel(*refs, k: int, t: Tile, residual: bool, norm: bool, glu: bool,
            round_first: bool, eps: float):
  """One (input row, block of `t.rows` output rows). refs: x (K,),
  [residual (K,)], w (rows, K), [up (rows, K)], out (rows,), [x + residual
  (K,)]."""
  it = iter(refs)
  x_ref = next(it)
  r_ref = next(it) if residual else None
  w_ref = next(it)
  u_ref = next(it) if glu else None
  o_ref = next(it)
  xs_ref = next(it) if residual else None
  f32 = jnp.float32
  first_column = pl.program_id(1) == 0

  def step(start, carry):
    acc, accu, ss = carry
    cols = pl.ds(start, t.chunk)
    xc = x_ref[cols].astype(f32)
    if residual:
      xb = (xc + r_ref[cols].astype(f32)).astype(xs_ref.dtype)
      xc = xb.astype(f32)

      @pl.when(first_column)
      def _():
        xs_ref[cols] = xb
    acc += w_ref[:, cols].astype(f32) * xc[None, :]
    if glu:
      accu += u_ref[:, cols].astype(f32) * xc[None, :]
    if norm:
      ss += xc * xc
    return acc, accu, ss

  zeros = jnp.zeros((t.rows, t.chunk), f32)
  carry = (zeros, zeros if glu else None, jnp.zeros((t.chunk,), f32))
  if t.stages:
    carry = jax.lax.fori_loop(
        0, k // t.chunk,
        lambda c, cr: step(pl.multiple_of(c * t.chunk, t.chunk), cr), carry)
  else:
    for c in range(k // t.chunk):
      carry = step(c * t.chunk, carry)
  acc, accu, ss = carry
  y = jnp.sum(acc, 1)
  u = jnp.sum(accu, 1) if glu else None
  if round_first:
    y = y.astype(jnp.bfloat16).astype(f32)
    u = u.astype(jnp.bfloat16).astype(f32) if glu else None
  if norm:
    r = jax.lax.rsqrt(jnp.sum(ss) / k + eps)
    y = y * r
    u = u * r if glu else None
  if glu:
    y = y * jax.nn.sigmoid(y) * u
  o_ref[...] = y.astype(o_ref.dtype)


def glu_rows(load_x, load_r, store_xs, load_g, load_u, *, k: int, chunk: int, rows: int,
             norm: bool, eps: float, xs_dtype=jnp.bfloat16) -> jax.Array:
  """Inside a Pallas kernel: a program's `rows` rows of silu(gate x') * up x'
  in float32, in the model's order (the gate and up products rounded to
  bfloat16, then RMSNorm's factor of x', then the SiLU), unrolled over the
  K / chunk column chunks (the kernels of mlp.py and phases.py).

  load_x(cols), load_r(cols): the input row's and the residual's chunk (load_r
  None: no residual); store_xs(cols, xb): writes x' = x + residual rounded to
  xs_dtype (the caller decides which program writes); load_g(cols),
  load_u(cols): the (rows, chunk) weight blocks of gate and up.
  """
  f32 = jnp.float32
  g = jnp.zeros((rows, chunk), f32)
  u = jnp.zeros((rows, chunk), f32)
  ss = jnp.zeros((chunk,), f32)
  for c in range(k // chunk):
    cols = pl.ds(c * chunk, chunk)
    xc = load_x(cols).astype(f32)
    if load_r is not None:
      xb = (xc + load_r(cols).astype(f32)).astype(xs_dtype)
      xc = xb.astype(f32)
      store_xs(cols, xb)
    g += load_g(cols).astype(f32) * xc[None, :]
    u += load_u(cols).astype(f32) * xc[None, :]
    if norm:
      ss += xc * xc
  gs = jnp.sum(g, 1).astype(jnp.bfloat16).astype(f32)
  us = jnp.sum(u, 1).astype(jnp.bfloat16).astype(f32)
  if norm:
    r = jax.lax.rsqrt(jnp.sum(ss) / k + eps)
    gs, us = gs * r, us * r
  return gs * jax.nn.sigmoid(gs) * us


def matvec(x: jax.Array, w: jax.Array, *, residual: jax.Array | None = None,
           norm_eps: float | None = None, glu: bool = False, round_first: bool = False,
           out_dtype=jnp.bfloat16, tile_: Tile | None = None,
           interpret: bool = False):
  """Rows of x times w, with the step's neighbouring work folded in.

  Args:
    x: (M, K) bfloat16 input rows (M small: each row reads w once more).
    w: (N, K) bfloat16, contracting-minor; with glu, [gate; up] (2F, K).
    residual: None or (M, K) bfloat16: the input is x + residual, rounded to
      bfloat16, and is returned as well.
    norm_eps: None, or RMSNorm's epsilon: the output is scaled by the input
      row's rsqrt(mean(x^2) + eps).
    glu: output silu(gate) * up, (M, F).
    round_first: round the product to bfloat16 before the factor.
    out_dtype: the output's dtype (float32 or bfloat16).
    tile_: the program's share (`tile` when None).
    interpret: run in Pallas's interpreter (no GPU).

  Returns:
    y (M, N) (or (M, F) with glu) of out_dtype; with residual, (y, x +
    residual).

  Raises:
    ValueError: shapes that do not match, or a tile that does not divide
      them (rows must divide N or F, chunk must divide K; both powers of 2).

  Example (the MLP's gate and up product of one row, normalised, with the
  residual add of the all-reduce before it)::

    m, x = matvec(x, wgu, residual=attn_out, norm_eps=1e-5, glu=True,
                  round_first=True)
  """
  m, k = x.shape
  n2, k2 = w.shape
  n = n2 // 2 if glu else n2
  t = tile_ or tile(n, k, glu)
  if (k2 != k or (glu and n2 % 2) or (residual is not None and residual.shape != x.shape)
      or n % t.rows or k % t.chunk or t.rows & (t.rows - 1) or t.chunk & (t.chunk - 1)):
    raise ValueError(f"matvec: x {x.shape}, w {w.shape}, residual "
                     f"{None if residual is None else residual.shape} and tile {t} do not match")
  blocks = n // t.rows
  row = pl.BlockSpec((None, k), lambda i, j: (i, 0))
  in_specs = [row] + ([row] if residual is not None else [])
  in_specs.append(pl.BlockSpec((t.rows, k), lambda i, j: (j, 0)))
  if glu:
    in_specs.append(pl.BlockSpec((t.rows, k), lambda i, j: (blocks + j, 0)))
  out_specs = [pl.BlockSpec((None, t.rows), lambda i, j: (i, j))]
  out_shape = [jax.ShapeDtypeStruct((m, n), out_dtype)]
  if residual is not None:
    out_specs.append(row)
    out_shape.append(jax.ShapeDtypeStruct((m, k), x.dtype))
  kernel = functools.partial(_kernel, k=k, t=t, residual=residual is not None,
                             norm=norm_eps is not None, glu=glu, round_first=round_first,
                             eps=float(norm_eps or 0.0))
  args = [x] + ([residual] if residual is not None else []) + [w] + ([w] if glu else [])
  out = pl.pallas_call(
      kernel, grid=(m, blocks), in_specs=in_specs, out_specs=out_specs, out_shape=out_shape,
      compiler_params=plgpu.CompilerParams(num_warps=t.warps, num_stages=max(1, t.stages)),
      interpret=interpret, name="matvec_glu" if glu else "matvec")(*args)
  return (out[0], out[1]) if residual is not None else out[0]
