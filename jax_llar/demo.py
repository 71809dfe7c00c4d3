"""Main job: tensor-parallel Llama-style decoding, ``lax.psum`` vs ``jax_llar.psum``.

``python -m jax_llar.demo [--preset llama3-8b-4l] [--tokens 64] [--batch 1]``

A Llama-3-style decoder stack (RMSNorm, rotary embeddings, grouped-query
attention with a KV cache, SwiGLU MLP; bf16, random weights) runs tensor
parallel over all local devices with ``jax.shard_map`` (Megatron layout:
attention heads and MLP columns split over the ``tp`` axis, one all-reduce
after the attention output projection and one after the MLP down
projection; the LM head is split over the vocabulary and the greedy argmax is
combined with one more all-reduce). It decodes ``--tokens`` tokens greedily in
one jitted ``lax.scan``, once with ``lax.psum`` and once with
``jax_llar.psum``, prints the inter-token latency of each (median over
``--repeats`` timed runs of the whole decode, divided by the token count) and
checks that both produce the same token ids.

Presets: ``llama3-8b-4l`` (Llama-3-8B widths: d_model 4096, 32 query heads,
8 KV heads, head dim 128, MLP 14336, vocabulary 128256; 4 layers) and
``small`` (d_model 512, 4 layers, for CPU runs). Without a GPU the demo forces
host devices (XLA_FLAGS) and says that the fast path is inactive.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

from jax_llar import _host


@dataclasses.dataclass(frozen=True)
class Config:
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
  """Returns (init_params, init_cache, decode) for `mesh` (axis 'tp')."""
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


def run(args) -> dict:
  gpu = _host.gpu_present()
  if not gpu:
    _host.force_host_devices(args.cpu_devices)
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax import lax
  from jax.sharding import Mesh

  import jax_llar

  devices = jax.devices()
  platform = devices[0].platform
  preset = args.preset or ("llama3-8b-4l" if platform == "gpu" else "small")
  cfg = PRESETS[preset]
  n = args.tp or len(devices)
  mesh = Mesh(np.array(devices[:n]), ("tp",))
  max_len = args.tokens + 1
  print(f"jax_llar demo: {preset} ({cfg.n_layers} layers, d_model {cfg.d_model}, "
        f"vocab {cfg.vocab}), bf16, TP={n} over {platform} "
        f"({devices[0].device_kind}), batch {args.batch}, {args.tokens} tokens")
  st = jax_llar.status()
  if not st["active"]:
    print("jax_llar.psum lowers to lax.psum here, so both runs use the same "
          "all-reduce.")

  results = {}
  tokens = {}
  first = jnp.zeros((args.batch,), jnp.int32) + 128000 % cfg.vocab
  for name, fn in (("lax.psum", lax.psum), ("jax_llar.psum", jax_llar.psum)):
    init_params, init_cache, decode = build(cfg, mesh, fn, args.batch, max_len)
    params = init_params(jax.random.key(args.seed))
    times = []
    for i in range(args.repeats + 1):
      kc, vc = init_cache()
      jax.block_until_ready((kc, vc))
      t0 = time.perf_counter()
      toks, kc, vc = decode(params, first, kc, vc, args.tokens)
      toks.block_until_ready()
      if i > 0:  # the first call compiles
        times.append(time.perf_counter() - t0)
    tokens[name] = np.asarray(toks)
    results[name] = {"itl_us": statistics.median(times) / args.tokens * 1e6,
                     "itl_us_min": min(times) / args.tokens * 1e6,
                     "itl_us_max": max(times) / args.tokens * 1e6}
    del params
  fast = [d for d in jax_llar.dispatch_log() if d.fast]
  agree = bool(np.array_equal(tokens["lax.psum"], tokens["jax_llar.psum"]))
  print(f"{'all-reduce':16s} {'inter-token latency (us)':>26s}")
  for name, r in results.items():
    print(f"{name:16s} {r['itl_us']:12.1f}  [min {r['itl_us_min']:.1f}, max {r['itl_us_max']:.1f}]")
  if fast:
    speed = results["lax.psum"]["itl_us"] / results["jax_llar.psum"]["itl_us"]
    print(f"speed-up {speed:.2f}x; jax_llar fast path active ({len(fast)} distinct "
          f"psum lowerings on it); tokens agree: {agree}")
  else:
    print(f"jax_llar fast path inactive: no speed-up to report (the two rows "
          f"differ only by noise); tokens agree: {agree}")
  print(f"first tokens: {tokens['jax_llar.psum'][:8, 0].tolist()}")
  return {"preset": preset, "config": dataclasses.asdict(cfg), "tp": n,
          "platform": platform, "device_kind": devices[0].device_kind,
          "batch": args.batch, "tokens": args.tokens, "repeats": args.repeats,
          "results": results, "tokens_agree": agree, "fast_path_active": bool(fast),
          "token_ids": tokens["jax_llar.psum"][:, 0].tolist()}


def app_result(out: dict, env: dict, command: str) -> dict:
  """The demo's output in the result shape of BENCHMARK.md (level "app",
  metric itl_us, impl names lax.psum / llar.auto), with the raw output kept
  under "demo"."""
  workload = f"{out['preset']} batch {out['batch']} tokens {out['tokens']}"
  names = {"lax.psum": "lax.psum", "jax_llar.psum": "llar.auto"}
  rows = [{"impl": names[k], "world_size": out["tp"], "dtype": "bfloat16",
           "metric": "itl_us", "value": v["itl_us"], "min": v["itl_us_min"],
           "max": v["itl_us_max"], "workload": workload,
           # llar.auto lowered to lax.psum wherever the fast path was off.
           "fast_path": bool(out["fast_path_active"]) if k == "jax_llar.psum" else None}
          for k, v in out["results"].items()]
  return {"env": env, "level": "app", "command": command, "rows": rows, "demo": out}


def main(argv=None) -> int:
  p = argparse.ArgumentParser(
      prog="python -m jax_llar.demo",
      description=__doc__.splitlines()[0] + " Prints inter-token latency in "
      "microseconds.", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  p.add_argument("--preset", choices=sorted(PRESETS), default=None,
                 help="model widths (none given: llama3-8b-4l on GPU, small on CPU)")
  p.add_argument("--tokens", type=int, default=64, help="tokens decoded per run")
  p.add_argument("--batch", type=int, default=1, help="sequences decoded together")
  p.add_argument("--repeats", type=int, default=5, help="timed runs (after one compile run)")
  p.add_argument("--tp", type=int, default=0, help="devices to use (0: all)")
  p.add_argument("--cpu-devices", type=int, default=2,
                 help="host devices to force when there is no GPU")
  p.add_argument("--seed", type=int, default=0, help="seed of the random weights")
  p.add_argument("--json", default="",
                 help="also write the results here (BENCHMARK.md result shape)")
  p.add_argument("--convert", nargs=3, metavar=("RAW", "ENV_JSON", "OUT"), default=None,
                 help="no run: rewrite RAW (a demo output written before --json used "
                      "the result shape) into the result shape, with the env block of "
                      "ENV_JSON (a result file of the same run)")
  args = p.parse_args(argv)
  if args.convert:
    raw, env_json, dest = args.convert
    with open(raw) as f:
      out = json.load(f)
    with open(env_json) as f:
      env = json.load(f)["env"]
    with open(dest, "w") as f:
      json.dump(app_result(out, env, f"python -m jax_llar.demo (converted from {raw})"),
                f, indent=1)
    return 0
  out = run(args)
  if args.json:
    from jax_llar import bench
    with open(args.json, "w") as f:
      json.dump(app_result(out, bench.environment(),
                           "python -m jax_llar.demo " + " ".join(argv or sys.argv[1:])),
                f, indent=1)
  return 0 if out["tokens_agree"] else 1


if __name__ == "__main__":
  sys.exit(main())
