"""Decode attention of one new position as one Pallas kernel (the step form
``model.Step(attn="pallas")``).

The kernel takes the new position's query, key and value projections as the
layer's product left them (one row per sequence, before the rotation), so
that no operand is made for the call: it rotates the queries and the key
(RoPE, as ``model.Model._rope``: float32, rounded to bfloat16 as the model
rounds them; the value rounded to bfloat16 too, as the cache holds it),
writes the key and the value into the layer's cache (K and V side by side
in its minor dimension, ``kv="fused"``), and attends each KV head's query
group to positions 0 .. pos: the scores, the softmax and the weighted sum of
V with a running maximum and sum (online softmax, FlashAttention-2, arXiv
2307.08691, Algorithm 1).

Its grid is (sequence, KV head, split): the positions are cut into splits of
whole chunks of `chunk` positions, and each program reads the chunks of its
split up to the one that holds pos, one chunk a step (the new position from
the values it computed, not from the cache; the positions after pos in that
chunk masked, the chunks after it not read). Each program leaves its
split's maximum, sum and unnormalised output; XLA combines the splits (the
split-K decoding of FlashDecoding; JAX's ``pallas/ops/gpu/decode_attention.py``
splits the same way). The program whose split holds pos writes the cache's
row pos. XLA's form (``attn="reduce"``) runs the rotation, the cache update,
the scores and the softmax with V as separate kernels over the whole cache,
masked beyond pos.

The arithmetic is float32 from the bfloat16 cache and projections; the
output is rounded to bfloat16 once. The reference form rounds the softmax's
weights to bfloat16 before the sum over V and computes the rotation's cosine
and sine with XLA's functions; this one does neither, so the two forms'
logits differ in rounding (compare them with ``model.Model.step_logits``).

On GPUs the kernel is compiled by Pallas's Triton backend; elsewhere it runs
in Pallas's interpreter (``interpret``), for tests of its arithmetic.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

# Elements of the scores' (query group, chunk, half head) products a program
# holds at once (the weighted sum of V's, over the whole head, twice as
# many): a chunk is as many positions, at least 8. Small, so that a
# program's products stay in registers: larger chunks ran several times
# slower on one H200 (benchmarks/NOTES.md).
PRODUCT_ELEMENTS = 1024
# Programs the grid aims at (the splits per (sequence, KV head) are chosen
# so that about this many run at once), on H200's 132 multiprocessors.
TARGET_PROGRAMS = 256


def _is_pow2(n: int) -> bool:
  return n > 0 and n & (n - 1) == 0


def _bf16(x):
  """x rounded to bfloat16, as float32."""
  return x.astype(jnp.bfloat16).astype(jnp.float32)


def _rotate(x1, x2, cos, sin):
  """RoPE of the halves x1, x2 (rows, hd / 2): the rotated halves, rounded to
  bfloat16 as the model rounds its rotated queries and keys."""
  return _bf16(x1 * cos - x2 * sin), _bf16(x2 * cos + x1 * sin)


def _kernel(pos_ref, freq_ref, q_ref, k_ref, v_ref, cache_ref, o_ref, m_ref, l_ref,
            cache_out_ref, *, hd: int, length: int, chunk: int, steps: int, scale: float):
  """One (sequence, KV head, split): q_ref (G, hd), k_ref and v_ref (1, hd)
  of the qkv row; cache_ref and cache_out_ref (length, 2 hd) (the same
  buffer); o_ref (G, hd), m_ref and l_ref (G,) the split's unnormalised
  output, maximum and sum."""
  half = hd // 2
  pos = pos_ref[0]
  first = pl.program_id(2) * (steps * chunk)  # the split's first position
  ang = pos.astype(jnp.float32) * freq_ref[...]  # (half,)
  cos, sin = jnp.cos(ang)[None, :], jnp.sin(ang)[None, :]
  f32 = lambda r: r.astype(jnp.float32)
  q1, q2 = _rotate(f32(q_ref[:, pl.ds(0, half)]), f32(q_ref[:, pl.ds(half, half)]), cos, sin)
  k1, k2 = _rotate(f32(k_ref[:, pl.ds(0, half)]), f32(k_ref[:, pl.ds(half, half)]), cos, sin)
  vn = _bf16(f32(v_ref[...]))  # (1, hd), rounded as the cache holds it

  @pl.when((first <= pos) & (pos < first + steps * chunk))
  def _():  # the new position's row of the cache
    cache_out_ref[pl.ds(pos, 1), pl.ds(0, half)] = k1.astype(cache_out_ref.dtype)
    cache_out_ref[pl.ds(pos, 1), pl.ds(half, half)] = k2.astype(cache_out_ref.dtype)
    cache_out_ref[pl.ds(pos, 1), pl.ds(hd, hd)] = vn.astype(cache_out_ref.dtype)

  def body(i, carry):
    m, l, o = carry
    start = first + i * chunk
    idx = start + jnp.arange(chunk)
    inside = (idx < length)[:, None]
    load = lambda c, w: plgpu.load(cache_ref.at[pl.ds(start, chunk), pl.ds(c, w)],
                                   mask=inside, other=0.0).astype(jnp.float32)
    new = (idx == pos)[:, None]
    # The new position from the values above (this program's read of row
    # pos may come before or after the store); rows after pos hold no key
    # of this sequence yet: their values are set to 0, so that no stale NaN
    # or inf reaches the sum (0 x NaN is NaN), and their scores to -inf.
    c1 = jnp.where(new, k1, load(0, half))  # (chunk, half)
    c2 = jnp.where(new, k2, load(half, half))
    v = jnp.where(new, vn, jnp.where((idx < pos)[:, None], load(hd, hd), 0.0))
    s = (jnp.sum(q1[:, None, :] * c1[None, :, :], -1) +
         jnp.sum(q2[:, None, :] * c2[None, :, :], -1)) * scale  # (G, chunk)
    s = jnp.where((idx <= pos)[None, :], s, -jnp.inf)
    m_new = jnp.maximum(m, jnp.max(s, -1))
    c = jnp.exp(m - m_new)
    p = jnp.exp(s - m_new[:, None])
    l = l * c + jnp.sum(p, -1)
    o = o * c[:, None] + jnp.sum(p[:, :, None] * v[None, :, :], 1)
    return m_new, l, o

  g = q_ref.shape[0]
  # The split's chunks up to the one that holds pos (none when the split
  # starts after pos: its maximum stays -inf and its sum 0). Every chunk
  # read holds a position at or before pos, so the running maximum is
  # finite after the first and exp(m - m_new) is never exp(-inf + inf).
  n = jnp.clip(pl.cdiv(pos + 1 - first, chunk), 0, steps)
  m, l, o = lax.fori_loop(0, n, body, (jnp.full((g,), -jnp.inf, jnp.float32),
                                       jnp.zeros((g,), jnp.float32),
                                       jnp.zeros((g, hd), jnp.float32)))
  o_ref[...] = o
  m_ref[...] = m
  l_ref[...] = l


def plan(batch: int, kv_heads: int, group: int, hd: int, length: int) -> tuple[int, int, int]:
  """(chunk, steps, splits): positions a step, steps a program, programs
  per (sequence, KV head). The chunk keeps a program's products within
  PRODUCT_ELEMENTS (at least 8 positions); the splits aim at
  TARGET_PROGRAMS programs in all, each at least one chunk."""
  chunk = max(8, PRODUCT_ELEMENTS // (group * (hd // 2)))
  chunks = pl.cdiv(length, chunk)
  splits = max(1, min(chunks, TARGET_PROGRAMS // max(1, batch * kv_heads)))
  steps = pl.cdiv(chunks, splits)
  return chunk, steps, pl.cdiv(chunks, steps)


def decode_attention(qkv: jax.Array, cache: jax.Array, pos: jax.Array, freq: jax.Array, *,
                     heads: int, interpret: bool = False) -> tuple[jax.Array, jax.Array]:
  """The attention of one new position and the cache it updates.

  Args:
    qkv: (B, (heads + 2 KV) hd) the new position's query, key and value
      projections (query heads grouped by KV head, as ``model.Model``
      orders them), before the rotation; float32 or bfloat16.
    cache: (B, KV, S, 2 hd) K (rotated) and V side by side, positions
      0 .. pos - 1 filled; donated: the result is the same buffer with
      position pos set.
    pos: int32 scalar, the new position (0 <= pos < S).
    freq: (hd / 2,) float32, RoPE's frequencies (``model.Model._rope``'s
      ``rope_theta ** (-i / (hd / 2))``).
    heads: query heads (a multiple of KV).
    interpret: run in Pallas's interpreter (no GPU).

  Returns:
    (o, cache): o (B, KV, G, hd) in the cache's dtype, G = heads / KV, and
    the updated cache.

  Raises:
    ValueError: shapes that do not match, or G and hd not powers of two
      (Triton's block shapes).

  Example (one sequence, 8 query heads over 2 KV heads, head dimension 64,
  a cache of 128 positions, the new one at position 10)::

    freq = 500000.0 ** (-jnp.arange(32, dtype=jnp.float32) / 32)
    o, cache = decode_attention(qkv, cache, jnp.int32(10), freq, heads=8)
  """
  b, kl, length, hd2 = cache.shape
  hd = hd2 // 2
  g = heads // kl if kl else 0
  if (heads % max(kl, 1) or qkv.shape != (b, (heads + 2 * kl) * hd)
      or freq.shape != (hd // 2,)):
    raise ValueError(f"decode_attention: qkv {qkv.shape}, cache {cache.shape}, "
                     f"freq {freq.shape} and {heads} heads do not match")
  if not (_is_pow2(g) and _is_pow2(hd) and hd >= 2):
    raise ValueError(f"decode_attention: the query group ({g}) and the head dimension ({hd}) "
                     "must be powers of two")
  chunk, steps, splits = plan(b, kl, g, hd, length)
  kernel = functools.partial(_kernel, hd=hd, length=length, chunk=chunk, steps=steps,
                             scale=float(hd) ** -0.5)
  rows = qkv.reshape(b, heads + 2 * kl, hd)
  whole = lambda *shape: pl.BlockSpec(shape, lambda i, j, s: (0,) * len(shape))
  part = lambda *shape: pl.BlockSpec((None, None, None, *shape),
                                     lambda i, j, s: (i, j, s) + (0,) * len(shape))
  cache_spec = pl.BlockSpec((None, None, length, hd2), lambda i, j, s: (i, j, 0, 0))
  o, m, l, cache = pl.pallas_call(
      kernel,
      grid=(b, kl, splits),
      in_specs=[whole(1), whole(hd // 2),
                pl.BlockSpec((None, g, hd), lambda i, j, s: (i, j, 0)),  # the group's queries
                pl.BlockSpec((None, 1, hd), lambda i, j, s: (i, heads + j, 0)),  # its key
                pl.BlockSpec((None, 1, hd), lambda i, j, s: (i, heads + kl + j, 0)),  # value
                cache_spec],
      out_specs=[part(g, hd), part(g), part(g), cache_spec],
      out_shape=[jax.ShapeDtypeStruct((b, kl, splits, g, hd), jnp.float32),
                 jax.ShapeDtypeStruct((b, kl, splits, g), jnp.float32),
                 jax.ShapeDtypeStruct((b, kl, splits, g), jnp.float32),
                 jax.ShapeDtypeStruct(cache.shape, cache.dtype)],
      input_output_aliases={5: 3},
      compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=2),
      interpret=interpret,
      name="decode_attention",
  )(jnp.reshape(pos, (1,)).astype(jnp.int32), freq.astype(jnp.float32), rows, rows, rows, cache)
  # The splits combined: each scaled to the largest maximum (a split with
  # no position keeps maximum -inf and weight 0). Written over the splits
  # one by one (their number is static) so that the combine is elementwise
  # and XLA makes it one kernel; a reduction over the splits' axis followed
  # by another made two.
  top = m[:, :, 0]
  for i in range(1, splits):
    top = jnp.maximum(top, m[:, :, i])
  num = jnp.zeros(o.shape[:2] + o.shape[3:], jnp.float32)
  den = jnp.zeros(top.shape, jnp.float32)
  for i in range(splits):
    w = jnp.exp(m[:, :, i] - top)  # (B, KV, G)
    num = num + w[..., None] * o[:, :, i]
    den = den + w * l[:, :, i]
  return (num / den[..., None]).astype(cache.dtype), cache
