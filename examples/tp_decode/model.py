"""A Llama-3-style decoder stack, tensor parallel over a mesh axis "tp".

RMSNorm, rotary embeddings, grouped-query attention with a KV cache and a
SwiGLU MLP, in bfloat16 with random weights. The Megatron layout splits the
attention heads and the MLP columns over "tp": one all-reduce follows the
attention output projection and one the MLP down projection; the LM head is
split over the vocabulary and the greedy argmax is combined with one more
all-reduce, so a step holds 2 x layers + 1 all-reduces, each through the
given psum function. Decoding runs in one jitted lax.scan.

Presets: llama3-8b-4l (Llama-3-8B widths: d_model 4096, 32 query heads, 8 KV
heads, head dim 128, MLP 14336, vocabulary 128256; 4 layers) and small
(d_model 512, 4 layers, for CPU runs).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Config:
  """Model widths.

  Attributes:
    d_model: residual width. n_heads / n_kv_heads: query and key-value heads
      (grouped-query attention). head_dim: width of one head. d_ff: MLP
      width. vocab: vocabulary size. n_layers: decoder layers. rope_theta:
      base of the rotary frequencies. norm_eps: RMSNorm epsilon.
  """
  d_model: int
  n_heads: int
  n_kv_heads: int
  head_dim: int
  d_ff: int
  vocab: int
  n_layers: int
  rope_theta: float = 500_000.0
  norm_eps: float = 1e-5


PRESETS = {
    "llama3-8b-4l": Config(4096, 32, 8, 128, 14336, 128256, 4),
    "small": Config(512, 8, 4, 64, 1536, 8192, 4),
}


def build(cfg: Config, mesh, psum_fn, batch: int, max_len: int):
  """The model's jitted functions on `mesh` (axis "tp"), all-reduces through
  ``psum_fn(x, "tp")`` (lax.psum or jax_llar.psum).

  Returns:
    (init_params, init_cache, decode):
      init_params(key) -> dict of bfloat16 weights, sharded per layout;
      init_cache() -> (k, v), each (layers, batch, max_len, KV heads,
        head_dim) bfloat16, sharded over KV heads;
      decode(params, first_tok, k, v, n_tokens) -> (tokens, k, v): greedy
        decoding of n_tokens (static) tokens from first_tok (batch,) int32;
        tokens is (n_tokens, batch) int32; k and v are donated.

  Raises:
    ValueError: when the tensor-parallel size does not divide the heads, KV
      heads, MLP width and vocabulary.
  """
  import jax
  import jax.numpy as jnp
  from jax import lax
  from jax.sharding import NamedSharding, PartitionSpec as P

  tp = mesh.shape["tp"]
  if cfg.n_heads % tp or cfg.n_kv_heads % tp or cfg.d_ff % tp or cfg.vocab % tp:
    raise ValueError(f"tensor-parallel size {tp} must divide heads, KV heads, "
                     "MLP width and vocabulary")
  dt = jnp.bfloat16
  L, D, H, KV, hd, F, V = (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads,
                           cfg.head_dim, cfg.d_ff, cfg.vocab)
  # One array per layer and weight (no stacked weights: slicing a stacked
  # array inside the decode step can copy the slice every token).
  per_layer = {
      "attn_norm": ((D,), P()),
      "wq": ((D, H * hd), P(None, "tp")),
      "wk": ((D, KV * hd), P(None, "tp")),
      "wv": ((D, KV * hd), P(None, "tp")),
      "wo": ((H * hd, D), P("tp", None)),
      "mlp_norm": ((D,), P()),
      "w_gate": ((D, F), P(None, "tp")),
      "w_up": ((D, F), P(None, "tp")),
      "w_down": ((F, D), P("tp", None)),
  }
  shapes = {"embed": ((V, D), P()), "final_norm": ((D,), P()),
            "lm_head": ((D, V), P(None, "tp"))}
  for i in range(L):
    for k, v in per_layer.items():
      shapes[f"{k}.{i}"] = v
  specs = {k: s for k, (_, s) in shapes.items()}

  def init_params(key):
    keys = jax.random.split(key, len(shapes))
    out = {}
    for k, (name, (shape, _)) in zip(keys, shapes.items()):
      if "norm" in name:
        out[name] = jnp.ones(shape, dt)
      else:
        fan_in = shape[-2] if len(shape) >= 2 else 1
        std = 1.0 if name == "embed" else fan_in ** -0.5
        out[name] = (jax.random.normal(k, shape, jnp.float32) * std).astype(dt)
    return out

  param_shardings = {k: NamedSharding(mesh, s) for k, s in specs.items()}
  init_params = jax.jit(init_params, out_shardings=param_shardings)
  cache_spec = P(None, None, None, "tp", None)  # (L, B, S, KV, hd)
  cache_shape = (L, batch, max_len, KV, hd)

  def init_cache():
    z = jnp.zeros(cache_shape, dt)
    return z, z
  init_cache = jax.jit(init_cache, out_shardings=(NamedSharding(mesh, cache_spec),) * 2)

  def rms(x, w):
    x32 = x.astype(jnp.float32)
    y = x32 * lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + cfg.norm_eps)
    return (y * w.astype(jnp.float32)).astype(dt)

  def rope(x, pos):  # x: (B, heads, hd)
    half = hd // 2
    freq = cfg.rope_theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
    ang = pos.astype(jnp.float32) * freq
    cos, sin = jnp.cos(ang), jnp.sin(ang)
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).astype(dt)

  def layer(x, lp, kc, vc, pos):
    h_loc, kv_loc = H // tp, KV // tp
    h = rms(x, lp["attn_norm"])
    q = (h @ lp["wq"]).reshape(batch, h_loc, hd)
    k = (h @ lp["wk"]).reshape(batch, kv_loc, hd)
    v = (h @ lp["wv"]).reshape(batch, kv_loc, hd)
    q, k = rope(q, pos), rope(k, pos)
    kc = lax.dynamic_update_slice(kc, k[:, None], (0, pos, 0, 0))
    vc = lax.dynamic_update_slice(vc, v[:, None], (0, pos, 0, 0))
    qg = q.reshape(batch, kv_loc, h_loc // kv_loc, hd)
    s = jnp.einsum("bkgd,bskd->bkgs", qg, kc, preferred_element_type=jnp.float32)
    s = s * (hd ** -0.5)
    s = jnp.where(jnp.arange(max_len) <= pos, s, -jnp.inf)
    p = jax.nn.softmax(s, -1).astype(dt)
    o = jnp.einsum("bkgs,bskd->bkgd", p, vc).reshape(batch, h_loc * hd)
    x = x + psum_fn(o @ lp["wo"], "tp")
    h = rms(x, lp["mlp_norm"])
    m = jax.nn.silu(h @ lp["w_gate"]) * (h @ lp["w_up"])
    x = x + psum_fn(m @ lp["w_down"], "tp")
    return x, kc, vc

  layer_keys = ("attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w_gate", "w_up", "w_down")

  def step(params, tok, kcache, vcache, pos):
    # Layers are unrolled; each layer updates its own cache slice in place.
    x = params["embed"][tok]  # (B, D)
    for i in range(L):
      lp = {k: params[f"{k}.{i}"] for k in layer_keys}
      x, kc, vc = layer(x, lp, kcache[i], vcache[i], pos)
      kcache = kcache.at[i].set(kc)
      vcache = vcache.at[i].set(vc)
    logits = rms(x, params["final_norm"]) @ params["lm_head"]  # (B, V/tp)
    logits = logits.astype(jnp.float32)
    # Greedy argmax over the vocabulary split across ranks: every rank puts
    # its (max, global index) in its own slot; one all-reduce shares them.
    r = lax.axis_index("tp")
    local_max = jnp.max(logits, -1)
    local_idx = jnp.argmax(logits, -1) + r * (V // tp)
    slots = jnp.zeros((batch, tp, 2), jnp.float32).at[:, r].set(
        jnp.stack([local_max, local_idx.astype(jnp.float32)], -1))
    slots = psum_fn(slots, "tp")
    best = jnp.argmax(slots[..., 0], -1)  # ties: lowest rank, as argmax over the whole row
    tok = jnp.take_along_axis(slots[..., 1], best[:, None], -1)[:, 0].astype(jnp.int32)
    return tok, kcache, vcache

  def decode(params, first_tok, kcache, vcache, n_tokens):
    def body(carry, pos):
      tok, kc, vc = carry
      tok, kc, vc = step(params, tok, kc, vc, pos)
      return (tok, kc, vc), tok
    (_, kcache, vcache), toks = lax.scan(body, (first_tok, kcache, vcache),
                                         jnp.arange(n_tokens))
    return toks, kcache, vcache

  def decode_sharded(params, first_tok, kcache, vcache, n_tokens):
    f = jax.shard_map(
        lambda p, t, k, v: decode(p, t, k, v, n_tokens), mesh=mesh,
        in_specs=(specs, P(), cache_spec, cache_spec),
        out_specs=(P(), cache_spec, cache_spec), check_vma=False)
    return f(params, first_tok, kcache, vcache)

  decode_jit = jax.jit(decode_sharded, static_argnums=(4,), donate_argnums=(2, 3))
  return init_params, init_cache, decode_jit
