"""A Llama-3 decoder, tensor parallel over a mesh axis "tp", for decoding.

RMSNorm, rotary embeddings, grouped-query attention with a KV cache and a
SwiGLU MLP, in bfloat16 with random weights (latency does not depend on the
values of the weights). The Megatron layout splits the attention heads and
the MLP columns over "tp": one all-reduce follows the attention output
projection and one the MLP down projection; the LM head is split over the
vocabulary and the greedy argmax is combined with one more all-reduce, so a
decode step holds 2 x layers + 1 all-reduces, each through the given psum
function.

The layout is the one a serving engine uses for batch-1 decoding:

- Every weight is stored as (output features, input features) per device,
  the contracting dimension minor, so that a matrix-vector product reads
  each row contiguously: as a product and a row reduction that reads the
  weight once (with the contracting dimension major XLA materialises the
  weight-sized product before reducing it: seen in the optimised HLO of a
  GPU compile of these shapes).
- Q, K and V are one fused matrix per device ([q heads; k heads; v heads] of
  that device), and so are the MLP's gate and up projections ([gate; up]).
- RMSNorm's gain is folded into the projection that follows it (the weights
  stand for W diag(g)), and its per-token factor rsqrt(mean(x^2) + eps)
  scales the projection's output: the normalised activation is never
  written out.
- Layers are unrolled over separate per-layer arrays. A `lax.scan` over
  stacked weights slices each layer's weights out of the stack with a
  dynamic slice, which XLA's GPU compiler materialises as a weight-sized
  copy every layer and token, and a loop over layers adds a loop trip per
  layer. hlo_check.py looks for such copies in the compiled program. The KV
  cache is one (batch, KV heads, length, 2 x head dim) array per layer, K and
  V side by side in the minor dimension (`Step.kv`), updated in place
  (`lax.dynamic_update_slice` on a donated buffer) with batch and KV heads
  leading.
- The embedding is replicated (one row is read per token); the LM head is
  its own (vocabulary, d_model) array split over the vocabulary. With tied
  embeddings (Llama-3.2-1B) the LM head holds the embedding's values, stored
  twice so that neither use slices the other.

At batch 1 the step is bound by the number of kernels more than by bytes
(a kernel costs 1-3 us however small), so the decode step (`Step`, the
default) is written for XLA to fuse it into few kernels, the arithmetic
unchanged: each matrix-vector product is a product and a row reduction in
float32 (`_mv`), which also sums x * x in the same pass, so that the RMSNorm
factor needs no reduction kernel of its own; gate, up and that sum are one
variadic reduction; decode attention is products and reductions (scores,
then masked softmax and the weighted sum of V in one more kernel); K and V
are written with one update. On one H200 running one TP=2 shard of
Llama-3.2-1B this is 9 kernels per layer where XLA's dots gave 13
(examples/tp_decode/profile_step.py lists them). The decode programs keep
their whole state (token, cache, position, output tokens) in donated
buffers that they return in place. With fresh output buffers and host-made
positions every call, a 16-token call cost 1.3-1.9 ms more (measured from
the latency at 16 and 64 tokens per call); XLA records buffer addresses into
the CUDA graph of the loop body and re-records it when they move.

Presets: llama3-8b (Llama-3-8B: 32 layers, d_model 4096, 32 query heads, 8
KV heads, head dim 128, MLP 14336, vocabulary 128256), llama3.2-1b (16
layers, d_model 2048, 32/8 heads, head dim 64, MLP 8192, vocabulary 128256,
tied embeddings), llama3-8b-4l (the 8B widths with 4 layers) and small
(d_model 512, 4 layers, for CPU runs). Llama-3.2's RoPE frequency scaling is
not modelled (it changes values, not the work). `Config.shard` gives the
widths one device holds at tensor-parallel size n, to study one device's
share of the step on one GPU.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import attention  # this folder's: the Pallas decode attention of Step(attn="pallas")
import matvec  # this folder's: the Pallas matrix-vector products of Step(mv="pallas")
import phases  # this folder's: the MLP as one kernel of two phases, Step(mlp="phases")

PsumFn = Callable[[jax.Array, str], jax.Array]
# add_norm(partial, residual, weight, axis_name, eps) -> (normed, new_residual):
# the all-reduce of a block's partial output, the residual add and the next
# RMSNorm (jax_llar.psum_add_rms_norm's signature, eps by keyword).
AddNormFn = Callable[..., tuple[jax.Array, jax.Array]]


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
  """RMSNorm of x's rows in float32, rounded once to x's dtype (the
  semantics of jax_llar.psum_add_rms_norm's normed output)."""
  h = x.astype(jnp.float32)
  inv = lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + jnp.float32(eps))
  return (h * inv * weight.astype(jnp.float32)).astype(x.dtype)


def unfused_add_norm(psum_fn: PsumFn) -> AddNormFn:
  """The add + RMSNorm step written with `psum_fn` and XLA's operations:
  what jax_llar.psum_add_rms_norm computes where it is not fused."""
  def add_norm(partial, residual, weight, axis_name, *, eps):
    new_residual = psum_fn(partial, axis_name) + residual
    return rms_norm(new_residual, weight, eps), new_residual
  return add_norm


class _Leaf(NamedTuple):
  """One weight: global shape, layout, standard deviation of its values."""
  shape: tuple[int, ...]
  spec: P
  std: float


@dataclasses.dataclass(frozen=True)
class Config:
  """Model widths.

  Attributes:
    d_model: residual width. n_heads / n_kv_heads: query and key-value heads
      (grouped-query attention). head_dim: width of one head. d_ff: MLP
      width. vocab: vocabulary size. n_layers: decoder layers.
    tied_embeddings: the LM head holds the embedding's values.
    rope_theta: base of the rotary frequencies. norm_eps: RMSNorm epsilon.
  """
  d_model: int
  n_heads: int
  n_kv_heads: int
  head_dim: int
  d_ff: int
  vocab: int
  n_layers: int
  tied_embeddings: bool = False
  rope_theta: float = 500_000.0
  norm_eps: float = 1e-5

  def n_params(self) -> int:
    """Parameters of the model (the LM head counted once when tied)."""
    d, hd = self.d_model, self.head_dim
    layer = (d * (self.n_heads + 2 * self.n_kv_heads) * hd + self.n_heads * hd * d
             + 3 * d * self.d_ff + 2 * d)
    head = 0 if self.tied_embeddings else self.vocab * d
    return self.n_layers * layer + self.vocab * d + head + d

  def shard(self, n: int) -> "Config":
    """The widths one device holds at tensor-parallel size n: query and KV
    heads, MLP width and vocabulary divided by n (d_model, head dim and
    layers unchanged). A model of these widths on one device does the
    per-device work of a TP=n decode step, without the all-reduces.

    Raises:
      ValueError: when n does not divide the heads, KV heads, MLP width and
        vocabulary.
    """
    if self.n_heads % n or self.n_kv_heads % n or self.d_ff % n or self.vocab % n:
      raise ValueError(f"{n} must divide the heads ({self.n_heads}), KV heads "
                       f"({self.n_kv_heads}), MLP width ({self.d_ff}) and vocabulary "
                       f"({self.vocab})")
    return dataclasses.replace(self, n_heads=self.n_heads // n,
                               n_kv_heads=self.n_kv_heads // n, d_ff=self.d_ff // n,
                               vocab=self.vocab // n)


PRESETS = {
    "llama3-8b": Config(4096, 32, 8, 128, 14336, 128256, 32),
    "llama3.2-1b": Config(2048, 32, 8, 64, 8192, 128256, 16, tied_embeddings=True),
    "llama3-8b-4l": Config(4096, 32, 8, 128, 14336, 128256, 4),
    "small": Config(512, 8, 4, 64, 1536, 8192, 4),
}

DTYPE = jnp.bfloat16
CACHE_SPEC = P(None, "tp", None, None)  # (batch, KV heads, length, [K | V] head dims)


def _mm(x: jax.Array, w: jax.Array, out_dtype=None) -> jax.Array:
  """x (M, K) times w (N, K) stored contracting-minor: (M, N)."""
  return lax.dot_general(x, w, (((1,), (1,)), ((), ())),
                         preferred_element_type=out_dtype)


def _mv(x: jax.Array, ws, with_ss: bool):
  """x (M, K) times each w (N, K) of `ws`, as a product and a row reduction
  in float32 (one kernel that reads each weight once); with `with_ss` the
  same reduction also sums x * x, so that every output row carries the sum
  of squares of its x row (RMSNorm's statistic) at no extra pass.

  Returns:
    ([y (M, N) float32 per w], ss (M, N) float32 or None).
  """
  m, k = x.shape
  n = ws[0].shape[0]
  xb = x[:, None, :].astype(jnp.float32)
  ops = [xb * w[None].astype(jnp.float32) for w in ws]
  if with_ss:
    ops.append(jnp.broadcast_to(xb * xb, (m, n, k)))
  out = lax.reduce(tuple(ops), (np.float32(0),) * len(ops),
                   lambda a, b: tuple(u + v for u, v in zip(a, b)), (2,))
  return (list(out[:-1]), out[-1]) if with_ss else (list(out), None)


def rms_factor(x: jax.Array, ss: jax.Array, eps: float) -> jax.Array:
  """RMSNorm's factor rsqrt(mean(x^2) + eps) of x (M, D) from `ss`, the sums
  of squares of x's rows that `_mv` carried along each output row (M, N):
  (M, N) float32."""
  return lax.rsqrt(ss / x.shape[-1] + eps)


def reduce_product(x: jax.Array, w: jax.Array) -> jax.Array:
  """x (M, K) times w (N, K) in the "reduce" form (`_mv`), rounded: (M, N)
  bfloat16 (the o and down products)."""
  (y,), _ = _mv(x, [w], False)
  return y.astype(DTYPE)


def reduce_normed(x: jax.Array, w: jax.Array, eps: float, round_first: bool = True) -> jax.Array:
  """RMSNorm(x) times w in the "reduce" form, the gain folded into w (the
  module docstring): the sum of squares rides in the product's reduction
  and the factor scales the product, rounded to bfloat16 first with
  `round_first` (the Q, K, V products) or not (the LM head's logits):
  (M, N) float32."""
  (y,), ss = _mv(x, [w], True)
  return (y.astype(DTYPE) if round_first else y) * rms_factor(x, ss, eps)


def reduce_glu_parts(x: jax.Array, wgu: jax.Array, eps: float) -> tuple[jax.Array, jax.Array]:
  """RMSNorm(x) times the gate and the up halves of wgu (2F, K) in one
  reduction with the sum of squares (glu "inrow"), each product rounded to
  bfloat16 and then scaled: (gate, up), each (M, F) float32 (`glu` takes
  them)."""
  f = wgu.shape[0] // 2
  (gt, up), ss = _mv(x, [wgu[:f], wgu[f:]], True)
  r = rms_factor(x, ss, eps)
  return gt.astype(DTYPE).astype(jnp.float32) * r, up.astype(DTYPE).astype(jnp.float32) * r


def glu(gt: jax.Array, up: jax.Array) -> jax.Array:
  """The MLP's silu(gate) * up, rounded: (M, F) bfloat16."""
  return (jax.nn.silu(gt) * up).astype(DTYPE)


# The products Step.pallas_products may name.
PALLAS_PRODUCTS = ("qkv", "o", "gu", "down", "head")


@dataclasses.dataclass(frozen=True)
class Step:
  """How the decode step is written; every form computes the same function
  in exact arithmetic, in a different order of float32 summation and with
  bfloat16 rounding at different points (e.g. the in-row norm scales the
  rounded product, the "apart" norm rounds the normalised input): the forms'
  logits differ by about 1% of the largest logit, so their greedy tokens
  can differ at a near tie (compare them with `Model.step_logits`).

  Attributes:
    mv: matrix-vector products (at most `mv_rows` rows) as "reduce" (a
      product and a row reduction, `_mv`), "dot" (XLA's dot, which it
      turns into a reduction, a Triton GEMM or a cuBLAS call) or "pallas"
      (one Pallas kernel a product, matvec.py, with the residual add that
      follows each all-reduce, RMSNorm's factor and the SiLU folded into
      the products after them: the residual stream is added in the next
      product's kernel, which writes it out; norm "inrow" or "fused", glu
      "inrow", head as with "reduce"; Pallas's interpreter off GPUs).
    pallas_products: with mv "pallas", the products that take the Pallas
      kernel (of "qkv", "o", "gu", "down", "head"); the others take `_mv`.
    norm: RMSNorm's sum of squares "inrow" (carried in the next product's
      reduction; needs mv "reduce" or "pallas"), "apart" (a reduction of its
      own) or
      "fused" (the all-reduce that ends a block, the residual add and the
      next RMSNorm in one step, the `add_norm` function the programs take,
      e.g. jax_llar.psum_add_rms_norm; the normalised activation is then
      written out in bfloat16 and the products take it as it is).
    glu: "inrow" (gate, up and the sum of squares in one variadic
      reduction; needs mv "reduce" or "pallas") or "apart" (one product of
      [gate; up]).
    attn: decode attention (one position) as "reduce" (products and
      reductions), "dot" (two batched matrix products) or "pallas" (the
      cache update, the scores, the softmax and V in one Pallas kernel that
      reads the cache only up to the position, attention.py; needs kv
      "fused"; Pallas's interpreter off GPUs).
    kv: "fused" (one cache per layer, K and V side by side in its minor
      dimension: one update per layer) or "split" (a K and a V cache).
    head: the LM head's product as "mv" (like the layers', with the sum of
      squares) or "dot".
    head_scale: scale the logits by RMSNorm's factor. The greedy argmax does
      not depend on a positive factor common to a row (and to every device),
      so False skips it (ties after rounding aside).
    mv_rows: largest M (batch x positions) that takes the `mv` forms; the
      prefill and larger batches use XLA's dots.
    mlp: with mv "pallas" and norm "inrow", "kernels" (the gate/up and the
      down product as the other products, a kernel each) or "phases" (both
      in one kernel of two phases, phases.py, `phases.tile`'s tiles; each
      layer's call has a slot of a sync array the step zeroes once; a wait
      that reached its bound makes the step's token -1).
  """
  mv: str = "reduce"
  norm: str = "inrow"
  glu: str = "inrow"
  attn: str = "reduce"
  kv: str = "fused"
  head: str = "mv"
  head_scale: bool = True
  mv_rows: int = 1
  pallas_products: tuple[str, ...] = PALLAS_PRODUCTS
  mlp: str = "kernels"

  @classmethod
  def parse(cls, spec: str) -> "Step":
    """The form of a command line's spec: "dots" (`dots`) or KEY:VALUE,...
    fields (booleans as 1/true/yes; tuples as A+B, e.g.
    "mv:pallas,pallas_products:gu+head").

    Raises:
      ValueError: an unknown field.
    """
    if spec == "dots":
      return cls.dots()
    defaults = dataclasses.asdict(cls())
    kw = {}
    for item in filter(None, spec.split(",")):
      k, _, v = item.partition(":")
      if k not in defaults:
        raise ValueError(f"step {spec}: unknown field {k}; known: {', '.join(defaults)}")
      d = defaults[k]
      kw[k] = (v.lower() in ("1", "true", "yes") if isinstance(d, bool)
               else tuple(filter(None, v.split("+"))) if isinstance(d, (tuple, list))
               else type(d)(v))
    return cls(**kw)

  @classmethod
  def dots(cls) -> "Step":
    """The step as first written: XLA's dots, a K and a V cache, RMSNorm's
    statistic apart."""
    return cls(mv="dot", norm="apart", glu="apart", attn="dot", kv="split", head="dot")


class Model:
  """The decoder of one `Config` on `mesh` (axis "tp") for `batch`
  sequences of at most `max_len` positions.

  Attributes:
    cfg, mesh, batch, max_len, tp: as given (tp: the mesh's "tp" size).
    param_specs: pytree of PartitionSpec, the layout of `init_params`.

  Raises:
    ValueError: when the tensor-parallel size does not divide the heads, KV
      heads, MLP width and vocabulary.
  """

  def __init__(self, cfg: Config, mesh: Mesh, batch: int, max_len: int,
               step: Step = Step()):
    self.cfg, self.mesh, self.batch, self.max_len = cfg, mesh, batch, max_len
    self.step = step
    if step.attn == "pallas" and step.kv != "fused":
      raise ValueError('Step(attn="pallas") needs kv="fused" (one cache per layer)')
    if step.mv == "pallas" and step.norm == "apart":
      raise ValueError('Step(mv="pallas") needs norm "inrow" or "fused"')
    if step.mlp not in ("kernels", "phases"):
      raise ValueError(f'Step.mlp: "kernels" or "phases", not {step.mlp!r}')
    if step.mlp == "phases" and (step.mv != "pallas" or step.norm != "inrow"):
      raise ValueError('Step(mlp="phases") needs mv "pallas" and norm "inrow"')
    unknown = set(step.pallas_products) - set(PALLAS_PRODUCTS)
    if unknown:
      raise ValueError(f"Step.pallas_products: unknown {sorted(unknown)}; known: "
                       f"{', '.join(PALLAS_PRODUCTS)}")
    self.tp = tp = mesh.shape["tp"]
    if cfg.n_heads % tp or cfg.n_kv_heads % tp or cfg.d_ff % tp or cfg.vocab % tp:
      raise ValueError(f"tensor-parallel size {tp} must divide the heads "
                       f"({cfg.n_heads}), KV heads ({cfg.n_kv_heads}), MLP width "
                       f"({cfg.d_ff}) and vocabulary ({cfg.vocab})")
    self.h_loc, self.kv_loc, self.f_loc = (cfg.n_heads // tp, cfg.n_kv_heads // tp,
                                           cfg.d_ff // tp)
    self.param_specs = self._map(lambda leaf: leaf.spec)

  @property
  def _pallas_interpret(self) -> bool:
    """Pallas kernels run in Pallas's interpreter off GPUs."""
    return self.mesh.devices.flat[0].platform != "gpu"

  # -- parameters ---------------------------------------------------------
  def _map(self, fn):
    """The parameter pytree with fn(_Leaf) at each leaf."""
    return jax.tree_util.tree_map(fn, self._tree(), is_leaf=lambda x: isinstance(x, _Leaf))

  def _tree(self):
    """The parameter pytree of `_Leaf`."""
    leaf = _Leaf
    c, tp = self.cfg, self.tp
    d, hd = c.d_model, c.head_dim
    nqkv = (self.h_loc + 2 * self.kv_loc) * hd  # rows of one device's fused QKV
    layers = [{
        "wqkv": leaf((tp * nqkv, d), P("tp", None), d ** -0.5),
        "wo": leaf((d, c.n_heads * hd), P(None, "tp"), (c.n_heads * hd) ** -0.5),
        "wgu": leaf((2 * c.d_ff, d), P("tp", None), d ** -0.5),
        "wdown": leaf((d, c.d_ff), P(None, "tp"), c.d_ff ** -0.5),
    } for _ in range(c.n_layers)]
    return {"embed": leaf((c.vocab, d), P(), 1.0),
            "lm_head": leaf((c.vocab, d), P("tp", None), d ** -0.5),
            "layers": layers}

  def init_params(self, seed: int) -> dict:
    """Random bfloat16 weights (standard normal scaled by fan-in ** -0.5),
    sharded per `param_specs`; with tied embeddings the LM
    head holds the embedding's values. One jitted generator per distinct
    shape, one call per array."""
    mesh = self.mesh
    keys = iter(jax.random.split(jax.random.key(seed), 8 * self.cfg.n_layers + 8))

    @functools.lru_cache(maxsize=None)
    def gen(shape, spec, std):
      out = NamedSharding(mesh, spec)
      return jax.jit(lambda k: (jax.random.normal(k, shape, jnp.float32) * std).astype(DTYPE),
                     out_shardings=out)

    params = self._map(lambda leaf: gen(*leaf)(next(keys)))
    if self.cfg.tied_embeddings:
      params["lm_head"] = jax.jit(lambda e: e, out_shardings=NamedSharding(
          mesh, P("tp", None)))(params["embed"])
    return params

  def weight_bytes_per_device(self) -> int:
    """Bytes of weights one device reads per decode step: its shards of every
    layer, its LM head shard and `batch` embedding rows."""
    tree = self._tree()
    tree["embed"] = _Leaf((self.batch, self.cfg.d_model), P(), 1.0)
    return sum(int(np.prod(leaf.shape)) * 2 // (self.tp if "tp" in leaf.spec else 1)
               for leaf in jax.tree_util.tree_leaves(
                   tree, is_leaf=lambda x: isinstance(x, _Leaf)))

  # -- KV cache -------------------------------------------------------------
  def cache_shape(self) -> tuple[int, ...]:
    """Global shape of one layer's K (or V) cache; with kv "fused", of its
    one cache (K and V side by side in the minor dimension)."""
    hd = self.cfg.head_dim * (2 if self.step.kv == "fused" else 1)
    return (self.batch, self.cfg.n_kv_heads, self.max_len, hd)

  @property
  def cache_arrays(self) -> int:
    """Cache arrays per layer: 1 (K and V fused) or 2."""
    return 1 if self.step.kv == "fused" else 2

  def kv_bytes_per_device(self) -> int:
    """Bytes of KV cache one device reads per decode step (all positions
    up to max_len of every layer's K and V: the attention reads the whole
    cache and masks the positions not yet written)."""
    return (self.cache_arrays * self.cfg.n_layers * int(np.prod(self.cache_shape())) * 2
            // self.tp)

  def init_cache(self) -> list:
    """Zeroed cache: per layer a tuple (k, v), or (kv,) with kv "fused", each
    `cache_shape()` bfloat16 sharded over KV heads."""
    z = jax.jit(lambda: jnp.zeros(self.cache_shape(), DTYPE),
                out_shardings=NamedSharding(self.mesh, CACHE_SPEC))
    return [tuple(z() for _ in range(self.cache_arrays)) for _ in range(self.cfg.n_layers)]

  def cache_specs(self) -> list:
    """The cache's layout, per layer a tuple of CACHE_SPEC."""
    return [(CACHE_SPEC,) * self.cache_arrays] * self.cfg.n_layers

  # -- the model, per device (inside shard_map) ----------------------------
  def _rms_scale(self, x, ss=None):
    """RMSNorm's per-row factor of x (M, D): (M, 1) float32; from `ss`, the
    sums of squares of x's rows that `_mv` carried along each output row,
    (M, N)."""
    if ss is not None:
      return rms_factor(x, ss, self.cfg.norm_eps)
    x32 = x.astype(jnp.float32)
    return lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + self.cfg.norm_eps)

  def _rope_freq(self):
    """RoPE's frequencies, (head_dim / 2,) float32."""
    half = self.cfg.head_dim // 2
    return self.cfg.rope_theta ** (-jnp.arange(half, dtype=jnp.float32) / half)

  def _rope(self, x, positions):  # x: (B, T, heads, hd); positions: (T,)
    half = self.cfg.head_dim // 2
    freq = self._rope_freq()
    ang = positions.astype(jnp.float32)[:, None] * freq  # (T, half)
    cos, sin = jnp.cos(ang)[None, :, None], jnp.sin(ang)[None, :, None]
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

  def _vec(self, m: int) -> bool:
    """Whether products of m rows take the `_mv` (or matvec) form."""
    return self.step.mv in ("reduce", "pallas") and m <= self.step.mv_rows

  def _mvp(self, x, w, **kw):
    """matvec.matvec on this model's device kind (its interpreter off GPUs)."""
    return matvec.matvec(x, w, interpret=self._pallas_interpret, **kw)

  def _layer(self, lp, x, h, cache, pos, psum_fn: PsumFn, add_norm: AddNormFn | None,
             pend=None, sync=None, slot: int = 0):
    """One decoder layer on x (B, T, D) at positions pos .. pos + T - 1; the
    new keys and values are written into the layer's cache (B, KV/tp, S,
    hd), a tuple (k, v) or (kv,). With norm "fused", h is x's RMSNorm
    (B, T, D) bfloat16 and the layer returns the next one; else h is None.
    With mv "pallas" (and norm "inrow"), pend is the all-reduced output not
    yet added to x (None: nothing pending): the layer's first product adds
    it, and the layer returns its own last all-reduce's output as pend.
    With mlp "phases", sync is the step's sync array (None: not this
    step) and slot this layer's slot of it.

    Returns:
      (x, h, cache, pend, sync) after the layer.
    """
    c, st = self.cfg, self.step
    b, t, d = x.shape
    hd, hl, kl = c.head_dim, self.h_loc, self.kv_loc
    g = hl // kl
    vec = self._vec(b * t)
    fused = st.norm == "fused"
    pallas = vec and st.mv == "pallas"
    pk = lambda name: pallas and name in st.pallas_products
    if pend is not None and not pk("qkv"):
      x, pend = x + pend, None
    xf = x.reshape(b * t, d)
    if pk("qkv") and fused:
      qkv = self._mvp(h.reshape(b * t, d), lp["wqkv"])
    elif pk("qkv"):
      res = None if pend is None else pend.reshape(b * t, d)
      out = self._mvp(xf, lp["wqkv"], residual=res, norm_eps=c.norm_eps, round_first=True,
                      out_dtype=jnp.float32)
      qkv, xf = out if res is not None else (out, xf)
      x, pend = xf.reshape(b, t, d), None
    elif fused:
      hf = h.reshape(b * t, d)
      qkv = _mv(hf, [lp["wqkv"]], False)[0][0].astype(DTYPE) if vec else _mm(hf, lp["wqkv"])
    elif vec and st.norm == "inrow":
      qkv = reduce_normed(xf, lp["wqkv"], c.norm_eps)
    elif vec:
      (y,), _ = _mv(xf, [lp["wqkv"]], False)
      qkv = y.astype(DTYPE) * self._rms_scale(xf)
    else:
      qkv = _mm(xf, lp["wqkv"]) * self._rms_scale(xf)
    if st.attn == "pallas" and t == 1:
      # The kernel rotates the projections, writes the cache row and attends
      # (attention.py): qkv is its operand as the product left it.
      (kv,) = cache
      o, kv = attention.decode_attention(qkv, kv, pos, self._rope_freq(), heads=hl,
                                         interpret=self._pallas_interpret)
      cache = (kv,)
      o = o.reshape(b * t, hl * hd)
    else:
      q = qkv[:, :hl * hd].reshape(b, t, hl, hd)
      k = qkv[:, hl * hd:(hl + kl) * hd].reshape(b, t, kl, hd)
      v = qkv[:, (hl + kl) * hd:].reshape(b, t, kl, hd)
      positions = pos + jnp.arange(t, dtype=jnp.int32)
      q, k = self._rope(q, positions).astype(DTYPE), self._rope(k, positions)
      k, v = k.astype(DTYPE).transpose(0, 2, 1, 3), v.astype(DTYPE).transpose(0, 2, 1, 3)
      if st.kv == "fused":
        (kv,) = cache
        kv = lax.dynamic_update_slice(kv, jnp.concatenate([k, v], -1), (0, 0, pos, 0))
        cache = (kv,)
        kc, vc = kv[..., :hd], kv[..., hd:]
      else:
        kc, vc = cache
        kc = lax.dynamic_update_slice(kc, k, (0, 0, pos, 0))
        vc = lax.dynamic_update_slice(vc, v, (0, 0, pos, 0))
        cache = (kc, vc)
      if st.attn == "reduce" and t == 1:
        # Each KV head's query group against the whole cache (masked beyond
        # pos): the scores in one reduction over hd, the softmax and the sum
        # of V over the positions in the next (XLA fuses them).
        qg = q.reshape(b, kl, g, hd).astype(jnp.float32)
        s = jnp.sum(qg[:, :, :, None, :] * kc[:, :, None].astype(jnp.float32), -1)
        s = s * (hd ** -0.5)  # (B, KV, G, S)
        mask = jnp.arange(self.max_len) <= pos
        p = jax.nn.softmax(jnp.where(mask, s, -jnp.inf), -1).astype(DTYPE)
        o = jnp.sum(p[..., None].astype(jnp.float32) * vc[:, :, None].astype(jnp.float32),
                    3).astype(DTYPE)  # (B, KV, G, hd)
        o = o.reshape(b * t, hl * hd)
      else:
        # Rows (t, g) of each KV head's query group: (B, KV, T * G, hd).
        qg = q.reshape(b, t, kl, g, hd).transpose(0, 2, 1, 3, 4).reshape(b, kl, t * g, hd)
        s = jnp.einsum("bkrd,bksd->bkrs", qg, kc, preferred_element_type=jnp.float32)
        s = s * (hd ** -0.5)
        mask = jnp.arange(self.max_len)[None, :] <= jnp.repeat(positions, g)[:, None]
        p = jax.nn.softmax(jnp.where(mask, s, -jnp.inf), -1).astype(DTYPE)
        o = jnp.einsum("bkrs,bksd->bkrd", p, vc)  # (B, KV, T * G, hd)
        o = o.reshape(b, kl, t, g, hd).transpose(0, 2, 1, 3, 4).reshape(b * t, hl * hd)
    if pk("o"):
      ao = self._mvp(o, lp["wo"])
    elif vec:
      ao = reduce_product(o, lp["wo"])
    else:
      ao = _mm(o, lp["wo"])
    f = self.f_loc
    if fused:
      h, x = add_norm(ao.reshape(b, t, d), x, self._gain(d), "tp", eps=c.norm_eps)
      hf = h.reshape(b * t, d)
    if sync is not None:
      # Gate/up (with the residual add and RMSNorm's factor), SiLU and down
      # in one kernel of two phases.
      dn, xf, sync = phases.mlp_phases(
          xf, lp["wgu"], lp["wdown"], sync, slot,
          residual=psum_fn(ao.reshape(b, t, d), "tp").reshape(b * t, d),
          norm_eps=c.norm_eps, interpret=self._pallas_interpret, **phases.tile(d, f))
      x = xf.reshape(b, t, d)
    elif pk("gu"):
      # The SiLU in the product's kernel; without the fused step, the
      # residual add of the all-reduce and RMSNorm's factor too.
      if fused:
        m = self._mvp(hf, lp["wgu"], glu=True, round_first=True)
      else:
        m, xf = self._mvp(xf, lp["wgu"], residual=psum_fn(ao.reshape(b, t, d), "tp").reshape(
            b * t, d), norm_eps=c.norm_eps, glu=True, round_first=True)
        x = xf.reshape(b, t, d)
    else:
      if fused and vec and st.glu == "inrow":
        (gt, up), _ = _mv(hf, [lp["wgu"][:f], lp["wgu"][f:]], False)
        gt = gt.astype(DTYPE).astype(jnp.float32)
        up = up.astype(DTYPE).astype(jnp.float32)
      elif fused:
        gu = (_mv(hf, [lp["wgu"]], False)[0][0].astype(DTYPE) if vec
              else _mm(hf, lp["wgu"])).astype(jnp.float32)
        gt, up = gu[:, :f], gu[:, f:]
      else:
        x = x + psum_fn(ao.reshape(b, t, d), "tp")
        xf = x.reshape(b * t, d)
        if vec and st.glu == "inrow":
          gt, up = reduce_glu_parts(xf, lp["wgu"], c.norm_eps)
        else:
          if vec:
            (gu,), ss = _mv(xf, [lp["wgu"]], st.norm == "inrow")
            gu = gu.astype(DTYPE).astype(jnp.float32) * self._rms_scale(xf, ss)
          else:
            gu = _mm(xf, lp["wgu"]).astype(jnp.float32) * self._rms_scale(xf)
          gt, up = gu[:, :f], gu[:, f:]
      m = glu(gt, up)
    if sync is not None:
      pass  # dn is the phase kernel's
    elif pk("down"):
      dn = self._mvp(m, lp["wdown"])
    elif vec:
      dn = reduce_product(m, lp["wdown"])
    else:
      dn = _mm(m, lp["wdown"])
    if fused:
      h, x = add_norm(dn.reshape(b, t, d), x, self._gain(d), "tp", eps=c.norm_eps)
    elif pallas:
      # Added by the next layer's first product (or the LM head's).
      pend = psum_fn(dn.reshape(b, t, d), "tp")
    else:
      x = x + psum_fn(dn.reshape(b, t, d), "tp")
    return x, h, cache, pend, sync

  @staticmethod
  def _gain(d: int) -> jax.Array:
    """RMSNorm's gain as the fused step takes it: ones, since the gains are
    folded into the projections that follow (the module docstring)."""
    return jnp.ones((d,), DTYPE)

  def _forward(self, params, tokens, cache, pos, psum_fn: PsumFn,
               add_norm: AddNormFn | None = None):
    """tokens (B, T) at positions pos ..: the greedy next token (B,) int32
    after the last position, and the updated cache. add_norm: the fused
    step of norm "fused" (default: `unfused_add_norm(psum_fn)`)."""
    logits, new_cache = self._logits(params, tokens, cache, pos, psum_fn, add_norm)
    # Greedy argmax over the vocabulary split across devices: every device
    # puts its (max, global index) in its own slot; one all-reduce shares
    # them. Ties go to the lowest device, as argmax over the whole row.
    tp, v_loc = self.tp, self.cfg.vocab // self.tp
    r = lax.axis_index("tp")
    local = jnp.stack([jnp.max(logits, -1),
                       (jnp.argmax(logits, -1) + r * v_loc).astype(jnp.float32)], -1)
    slots = jnp.zeros((self.batch, tp, 2), jnp.float32).at[:, r].set(local)
    slots = psum_fn(slots, "tp")
    best = jnp.argmax(slots[..., 0], -1)
    tok = jnp.take_along_axis(slots[..., 1], best[:, None], -1)[:, 0].astype(jnp.int32)
    if self.step.mlp == "phases":
      # NaN logits (a phase kernel's wait that timed out) on any device: -1.
      tok = jnp.where(jnp.isnan(jnp.max(slots[..., 0], -1)), -1, tok)
    return tok, new_cache

  def _logits(self, params, tokens, cache, pos, psum_fn: PsumFn,
              add_norm: AddNormFn | None = None):
    """As `_forward`, but this device's float32 logits (B, V/tp) of the last
    position (its slice of the vocabulary) in place of the token."""
    st = self.step
    if st.norm == "fused" and add_norm is None:
      add_norm = unfused_add_norm(psum_fn)
    x = params["embed"][tokens]  # (B, T, D)
    h = rms_norm(x, self._gain(x.shape[-1]), self.cfg.norm_eps) if st.norm == "fused" else None
    new_cache, pend = [], None
    sync = (phases.sync_buffer(len(params["layers"]))
            if st.mlp == "phases" and self._vec(x.shape[0] * x.shape[1]) else None)
    for i, (lp, cl) in enumerate(zip(params["layers"], cache)):  # unrolled
      with jax.named_scope(f"layer{i}"):  # names the layer in profiles and HLO
        x, h, cl, pend, sync = self._layer(lp, x, h, cl, pos, psum_fn, add_norm, pend,
                                           sync, i)
      new_cache.append(cl)
    xl = x[:, -1]
    pallas_head = (st.mv == "pallas" and "head" in st.pallas_products and st.head == "mv"
                   and self._vec(xl.shape[0]))
    if pend is not None and not pallas_head:
      xl = xl + pend[:, -1]
    if pallas_head and st.norm == "fused":
      logits = self._mvp(h[:, -1], params["lm_head"], out_dtype=jnp.float32)
    elif pallas_head:
      out = self._mvp(xl, params["lm_head"], out_dtype=jnp.float32,
                      residual=None if pend is None else pend[:, -1],
                      norm_eps=self.cfg.norm_eps if st.head_scale else None)
      logits = out[0] if pend is not None else out
    elif st.norm == "fused":
      # h is the last layer's output normalised: the head takes it as it is.
      hl = h[:, -1]
      if st.head == "mv" and self._vec(hl.shape[0]):
        (logits,), _ = _mv(hl, [params["lm_head"]], False)
      else:
        logits = _mm(hl, params["lm_head"], jnp.float32)
    elif st.head == "mv" and self._vec(xl.shape[0]) and st.head_scale and st.norm == "inrow":
      logits = reduce_normed(xl, params["lm_head"], self.cfg.norm_eps, round_first=False)
    elif st.head == "mv" and self._vec(xl.shape[0]):
      (logits,), _ = _mv(xl, [params["lm_head"]], False)
      if st.head_scale:
        logits = logits * self._rms_scale(xl)
    else:
      logits = _mm(xl, params["lm_head"], jnp.float32)  # (B, V/tp)
      if st.head_scale:
        logits = logits * self._rms_scale(xl)
    if sync is not None:
      # A phase kernel's wait that reached its bound: the outputs are wrong.
      logits = jnp.where(phases.timeouts(sync) > 0, jnp.nan, logits)
    return logits, new_cache

  def _sharded(self, fn, in_specs, out_specs):
    return jax.shard_map(fn, mesh=self.mesh, in_specs=in_specs, out_specs=out_specs,
                         check_vma=False)

  # -- jitted programs ------------------------------------------------------
  def prefill(self, psum_fn: PsumFn = lax.psum, add_norm: AddNormFn | None = None):
    """Jitted ``prefill(params, prompt, cache) -> (tok, cache)``: the prompt
    (B, T) int32 in one forward pass from position 0, filling the cache
    (donated); tok (B,) int32 is the greedy token after the prompt. add_norm
    as in `_forward` (used by norm "fused" only)."""
    def f(params, prompt, cache):
      return self._forward(params, prompt, cache, jnp.int32(0), psum_fn, add_norm)
    g = self._sharded(f, (self.param_specs, P(), self.cache_specs()),
                      (P(), self.cache_specs()))
    return jax.jit(g, donate_argnums=(2,))

  def decode_step(self, psum_fn: PsumFn, add_norm: AddNormFn | None = None):
    """Jitted ``step(params, tok, cache, pos) -> (tok, cache, pos)``: one
    token (B,) int32 at position pos (int32 scalar); cache and pos are
    donated and returned in place (pos + 1). add_norm as in `_forward`."""
    def f(params, tok, cache, pos):
      tok, cache = self._forward(params, tok[:, None], cache, pos, psum_fn, add_norm)
      return tok, cache, pos + 1
    g = self._sharded(f, (self.param_specs, P(), self.cache_specs(), P()),
                      (P(), self.cache_specs(), P()))
    return jax.jit(g, donate_argnums=(2, 3))

  def step_logits(self, psum_fn: PsumFn = lax.psum, add_norm: AddNormFn | None = None):
    """Jitted ``logits(params, tok, cache, pos) -> (logits, cache)``: as
    `decode_step`, but the float32 logits (B, V) of the next token (every
    device's slice of the vocabulary, in order) in place of the greedy token,
    for checks that compare forms by value rather than by a greedy choice
    that a near tie can flip. cache is donated and returned in place."""
    def f(params, tok, cache, pos):
      return self._logits(params, tok[:, None], cache, pos, psum_fn, add_norm)
    g = self._sharded(f, (self.param_specs, P(), self.cache_specs(), P()),
                      (P(None, "tp"), self.cache_specs()))
    return jax.jit(g, donate_argnums=(2,))

  def decode_scan(self, psum_fn: PsumFn, n_tokens: int, add_norm: AddNormFn | None = None):
    """Jitted ``decode(params, tok, cache, pos, toks) -> (toks, tok, cache,
    pos)``: greedy decoding of n_tokens tokens in one `lax.scan` from tok
    (B,) int32 at position pos (int32 scalar), the tokens written into toks
    (n_tokens, B) int32, tok the last of them (the next input), pos advanced
    by n_tokens. Every argument but the weights is donated and returned in
    place, so that the decode state keeps its buffers from call to call
    (XLA's CUDA graphs record buffer addresses). add_norm as in `_forward`."""
    def f(params, tok, cache, pos, toks):
      def body(carry, _):
        tok, cache, pos, toks, i = carry
        tok, cache = self._forward(params, tok[:, None], cache, pos, psum_fn, add_norm)
        toks = lax.dynamic_update_slice(toks, tok[None], (i, 0))
        return (tok, cache, pos + 1, toks, i + 1), None
      (tok, cache, pos, toks, _), _ = lax.scan(
          body, (tok, cache, pos, toks, jnp.int32(0)), None, length=n_tokens)
      return toks, tok, cache, pos
    g = self._sharded(f, (self.param_specs, P(), self.cache_specs(), P(), P()),
                      (P(), P(), self.cache_specs(), P()))
    return jax.jit(g, donate_argnums=(1, 2, 3, 4))


def build(cfg: Config, mesh: Mesh, batch: int, max_len: int, step: Step = Step()) -> Model:
  """The `Model` of `cfg` on `mesh` (see `Model`)."""
  return Model(cfg, mesh, batch, max_len, step)
