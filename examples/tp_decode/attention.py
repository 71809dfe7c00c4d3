"""Decode attention of one new position as one Pallas kernel (the step form
``model.Step(attn="pallas")``).

One program per (sequence, KV head) writes the new key and value into the
layer's cache (K and V side by side in its minor dimension, ``kv="fused"``)
and attends the KV head's query group to positions 0 .. pos: the scores, the
softmax and the weighted sum of V in one pass over the cache with a running
maximum and sum (online softmax, as in FlashAttention-2, arXiv 2307.08691,
Algorithm 1), reading only the positions before pos, and the new position
from the values it was given. XLA's form (``attn="reduce"``) runs the cache
update, the scores and the softmax with V as separate kernels over the whole
cache, masked beyond pos.

The arithmetic is float32 from the bfloat16 cache and query; the output is
rounded to bfloat16 once. The reference form rounds the softmax's weights to
bfloat16 before the sum over V; this one does not, so the two forms' logits
differ in rounding (compare them with ``model.Model.step_logits``).

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


def _is_pow2(n: int) -> bool:
  return n > 0 and n & (n - 1) == 0


def _kernel(pos_ref, q_ref, k_ref, v_ref, cache_ref, o_ref, cache_out_ref, *, hd: int,
            length: int, block: int, scale: float):
  """One (sequence, KV head): q_ref (G, hd), k_ref and v_ref (1, hd),
  cache_ref and cache_out_ref (length, 2 hd) (the same buffer), o_ref
  (G, hd)."""
  pos = pos_ref[0]
  # The new position: written into the cache, and attended from its values
  # (this program reads the cache only below pos).
  kn, vn = k_ref[...], v_ref[...]
  cache_out_ref[pl.ds(pos, 1), pl.ds(0, hd)] = kn
  cache_out_ref[pl.ds(pos, 1), pl.ds(hd, hd)] = vn
  q = q_ref[...].astype(jnp.float32)  # (G, hd)
  m = jnp.sum(q * kn.astype(jnp.float32), -1) * scale  # (G,): the new position's score
  l = jnp.ones_like(m)
  o = jnp.broadcast_to(vn.astype(jnp.float32), q.shape)

  def body(i, carry):
    m, l, o = carry
    start = i * block
    idx = start + jnp.arange(block)
    inside = idx < length
    k = plgpu.load(cache_ref.at[pl.ds(start, block), pl.ds(0, hd)], mask=inside[:, None],
                   other=0.0).astype(jnp.float32)  # (block, hd)
    v = plgpu.load(cache_ref.at[pl.ds(start, block), pl.ds(hd, hd)], mask=inside[:, None],
                   other=0.0).astype(jnp.float32)
    before = idx < pos
    # Rows at and past pos hold no key of this sequence yet: their weights
    # are 0, and their values are set to 0 so that no stale NaN or inf
    # reaches the sum (0 x NaN is NaN).
    v = jnp.where(before[:, None], v, 0.0)
    s = jnp.sum(q[:, None, :] * k[None, :, :], -1) * scale  # (G, block)
    s = jnp.where(before[None, :], s, -jnp.inf)
    m_new = jnp.maximum(m, jnp.max(s, -1))
    c = jnp.exp(m - m_new)
    p = jnp.exp(s - m_new[:, None])
    l = l * c + jnp.sum(p, -1)
    o = o * c[:, None] + jnp.sum(p[:, :, None] * v[None, :, :], 1)
    return m_new, l, o

  m, l, o = lax.fori_loop(0, pl.cdiv(pos, block), body, (m, l, o))
  o_ref[...] = (o / l[:, None]).astype(o_ref.dtype)


def decode_attention(q: jax.Array, k: jax.Array, v: jax.Array, cache: jax.Array,
                     pos: jax.Array, *, interpret: bool = False) -> tuple[jax.Array, jax.Array]:
  """The attention of one new position and the cache it updates.

  Args:
    q: (B, KV, G, hd) the queries of each KV head's group (after RoPE).
    k, v: (B, KV, 1, hd) the new position's key (after RoPE) and value.
    cache: (B, KV, S, 2 hd) K and V side by side, positions 0 .. pos - 1
      filled; donated: the result is the same buffer with position pos set.
    pos: int32 scalar, the new position (0 <= pos < S).
    interpret: run in Pallas's interpreter (no GPU).

  Returns:
    (o, cache): o (B, KV, G, hd) in q's dtype, and the updated cache.

  Raises:
    ValueError: shapes that do not match, or G and hd not powers of two
      (Triton's block shapes).

  Example (one sequence, 2 KV heads of 4 queries, head dimension 64, a
  cache of 128 positions, the new one at position 10)::

    o, cache = decode_attention(q, k, v, cache, jnp.int32(10))
  """
  b, kl, g, hd = q.shape
  length = cache.shape[2]
  if k.shape != (b, kl, 1, hd) or v.shape != k.shape or cache.shape != (b, kl, length, 2 * hd):
    raise ValueError(f"decode_attention: q {q.shape}, k {k.shape}, v {v.shape}, "
                     f"cache {cache.shape} do not match")
  if not (_is_pow2(g) and _is_pow2(hd)):
    raise ValueError(f"decode_attention: the query group ({g}) and the head dimension ({hd}) "
                     "must be powers of two")
  block = max(16, 2048 // hd)  # cache positions per step: the (G, block, hd) products
  kernel = functools.partial(_kernel, hd=hd, length=length, block=block,
                             scale=float(hd) ** -0.5)
  per = lambda *shape: pl.BlockSpec((None, None, *shape), lambda i, j: (i, j, 0, 0))
  o, cache = pl.pallas_call(
      kernel,
      grid=(b, kl),
      in_specs=[pl.BlockSpec((1,), lambda i, j: (0,)), per(g, hd), per(1, hd), per(1, hd),
                per(length, 2 * hd)],
      out_specs=[per(g, hd), per(length, 2 * hd)],
      out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                 jax.ShapeDtypeStruct(cache.shape, cache.dtype)],
      input_output_aliases={4: 1},
      compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=1),
      interpret=interpret,
      name="decode_attention",
  )(jnp.reshape(pos, (1,)).astype(jnp.int32), q, k.astype(q.dtype), v.astype(q.dtype), cache)
  return o, cache
