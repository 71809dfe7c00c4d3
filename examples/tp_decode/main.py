"""Tensor-parallel Llama-style decoding: lax.psum against jax_llar.psum.

  python examples/tp_decode/main.py [--preset llama3-8b-4l] [--tokens 64] [--json FILE]

Run from the repository root. A Llama-3-style decoder stack (model.py:
bfloat16, random weights, KV cache) runs tensor parallel over all local
devices with jax.shard_map, 2 all-reduces per layer and one for the greedy
argmax per token. It decodes --tokens tokens greedily in one jitted
lax.scan, once with lax.psum and once with jax_llar.psum, prints the
inter-token latency of each (median over --repeats timed runs of the whole
decode, divided by the token count, in microseconds; the timed runs of the two
alternate, so that a drift of the machine affects both alike) and checks that both
produce the same token ids; the exit status is 1 when they differ.

Without a GPU it runs the small preset on forced CPU devices (it sets
JAX_PLATFORMS=cpu and XLA_FLAGS and says so), where jax_llar.psum lowers to
lax.psum and both rows differ only by noise. --json writes the result in the
result-file shape of benchmarks/METHOD.md in the repository (level "app",
metric itl_us, impl names lax.psum and llar.auto).
"""

from __future__ import annotations

import json
import statistics
import sys
import time

from absl import flags

from jax_llar.tools import _cli, host, report

from model import PRESETS, build

PRESET = flags.DEFINE_enum("preset", None, sorted(PRESETS),
                           "Model widths (default: llama3-8b-4l on GPUs, small on CPU).")
TOKENS = flags.DEFINE_integer("tokens", 64, "Tokens decoded per run.", lower_bound=1)
BATCH = flags.DEFINE_integer("batch", 1, "Sequences decoded together.", lower_bound=1)
REPEATS = flags.DEFINE_integer("repeats", 5, "Timed runs, after one run that compiles.",
                               lower_bound=1)
TP = flags.DEFINE_integer("tp", 0, "Devices to use, the tensor-parallel size (0: all).",
                          lower_bound=0)
CPU_DEVICES = flags.DEFINE_integer("cpu_devices", 2,
                                   "Host devices to force when there is no GPU.",
                                   lower_bound=1)
SEED = flags.DEFINE_integer("seed", 0, "Seed of the random weights.")
JSON = flags.DEFINE_string("json", None, "Also write the result to this file.")


def run(preset: str | None, tokens: int, batch: int, repeats: int, tp: int,
        seed: int) -> dict:
  """Decodes with lax.psum and with jax_llar.psum and prints the comparison.

  Returns:
    dict with preset, config, tp, platform, device_kind, batch, tokens,
    repeats, results (per all-reduce: itl_us, itl_us_min, itl_us_max in
    microseconds), tokens_agree, fast_path_active and token_ids (the tokens
    decoded for the first sequence).
  """
  import dataclasses

  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax import lax
  from jax.sharding import Mesh

  import jax_llar

  devices = jax.devices()
  platform = devices[0].platform
  preset = preset or ("llama3-8b-4l" if platform == "gpu" else "small")
  cfg = PRESETS[preset]
  n = tp or len(devices)
  mesh = Mesh(np.array(devices[:n]), ("tp",))
  max_len = tokens + 1
  print(f"tp_decode: {preset} ({cfg.n_layers} layers, d_model {cfg.d_model}, "
        f"vocab {cfg.vocab}), bf16, TP={n} over {platform} "
        f"({devices[0].device_kind}), batch {batch}, {tokens} tokens")
  st = jax_llar.status()
  if not st["active"]:
    print("jax_llar.psum lowers to lax.psum here, so both runs use the same "
          "all-reduce.")

  first = jnp.zeros((batch,), jnp.int32) + 128000 % cfg.vocab
  decoders, params = {}, None
  for name, fn in (("lax.psum", lax.psum), ("jax_llar.psum", jax_llar.psum)):
    init_params, init_cache, decode = build(cfg, mesh, fn, batch, max_len)
    if params is None:  # the same weights (and shardings) serve both
      params = init_params(jax.random.key(seed))
    decoders[name] = (init_cache, decode)

  def decode_once(name):
    init_cache, decode = decoders[name]
    kc, vc = init_cache()
    jax.block_until_ready((kc, vc))
    t0 = time.perf_counter()
    toks, kc, vc = decode(params, first, kc, vc, tokens)
    toks.block_until_ready()
    return time.perf_counter() - t0, toks

  token_ids = {name: np.asarray(decode_once(name)[1]) for name in decoders}  # compiles
  times = {name: [] for name in decoders}
  names = list(decoders)
  for i in range(repeats):  # the two all-reduces alternate, first one first, then the other
    for name in (names if i % 2 == 0 else names[::-1]):
      times[name].append(decode_once(name)[0])
  results = {name: {"itl_us": statistics.median(t) / tokens * 1e6,
                    "itl_us_min": min(t) / tokens * 1e6,
                    "itl_us_max": max(t) / tokens * 1e6}
             for name, t in times.items()}
  fast = [d for d in jax_llar.dispatch_log() if d.fast]
  agree = bool(np.array_equal(token_ids["lax.psum"], token_ids["jax_llar.psum"]))
  print(f"{'all-reduce':16s} {'inter-token latency (us)':>26s}")
  for name, r in results.items():
    print(f"{name:16s} {r['itl_us']:12.1f}  [min {r['itl_us_min']:.1f}, "
          f"max {r['itl_us_max']:.1f}]")
  if fast:
    speed = results["lax.psum"]["itl_us"] / results["jax_llar.psum"]["itl_us"]
    print(f"speed-up {speed:.2f}x; jax_llar fast path active ({len(fast)} distinct "
          f"psum lowerings on it); tokens agree: {agree}")
  else:
    print(f"jax_llar fast path inactive: no speed-up to report (the two rows "
          f"differ only by noise); tokens agree: {agree}")
  print(f"first tokens: {token_ids['jax_llar.psum'][:8, 0].tolist()}")
  return {"preset": preset, "config": dataclasses.asdict(cfg), "tp": n,
          "platform": platform, "device_kind": devices[0].device_kind,
          "batch": batch, "tokens": tokens, "repeats": repeats,
          "results": results, "tokens_agree": agree, "fast_path_active": bool(fast),
          "token_ids": token_ids["jax_llar.psum"][:, 0].tolist()}


def app_result(out: dict, env: dict, command: str) -> dict:
  """`run`'s output in the result-file shape (level "app", metric itl_us,
  impl names lax.psum and llar.auto), with the raw output kept under
  "demo"."""
  workload = f"{out['preset']} batch {out['batch']} tokens {out['tokens']}"
  names = {"lax.psum": "lax.psum", "jax_llar.psum": "llar.auto"}
  rows = [{"impl": names[k], "world_size": out["tp"], "dtype": "bfloat16",
           "metric": "itl_us", "value": v["itl_us"], "min": v["itl_us_min"],
           "max": v["itl_us_max"], "workload": workload,
           # llar.auto lowered to lax.psum wherever the fast path was off.
           "fast_path": bool(out["fast_path_active"]) if k == "jax_llar.psum" else None}
          for k, v in out["results"].items()]
  return {"env": env, "level": "app", "command": command, "rows": rows, "demo": out}


def main() -> int:
  if not host.gpu_present():
    changed = host.use_cpu(CPU_DEVICES.value)
    if changed:
      print("no GPU here: running on forced CPU devices (" + ", ".join(changed) + ")",
            flush=True)
  out = run(PRESET.value, TOKENS.value, BATCH.value, REPEATS.value, TP.value, SEED.value)
  if JSON.value:
    result = app_result(out, report.environment(),
                        "python examples/tp_decode/main.py " + " ".join(sys.argv[1:]))
    with open(JSON.value, "w") as f:
      json.dump(result, f, indent=1)
    print(f"saved {JSON.value}")
  return 0 if out["tokens_agree"] else 1


if __name__ == "__main__":
  _cli.run(main)
