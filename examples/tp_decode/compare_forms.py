"""How far apart two forms of the decode step are, by logits.

  python examples/tp_decode/compare_forms.py [--preset small] [--seeds 6] [--steps 6]

Run from the repository root. For each prompt seed, builds the fused decode
step (model.Step()) and the step as first written (Step.dots()) on the
devices at hand (TP over all of them) and, with --shard, one TP=2 shard on
one device as well; fills both caches from the same random prompt and feeds
both the fused form's greedy tokens for --steps steps. Per step it prints
the largest logit difference relative to the largest logit, the fused
form's top-two margin on the same scale, and both greedy tokens (--other
names another form in place of the dots form); then the
range of the differences, the smallest margin, and how many steps' greedy
tokens differ. Without a GPU it runs on forced CPU devices. Exit status 0.
"""

from __future__ import annotations

from absl import flags

import model as model_lib

PRESET = flags.DEFINE_enum("preset", "small", sorted(model_lib.PRESETS), "Model widths.")
SEEDS = flags.DEFINE_integer("seeds", 6, "Prompt seeds 0 .. seeds-1.", lower_bound=1)
STEPS = flags.DEFINE_integer("steps", 6, "Decode steps per prompt.", lower_bound=1)
PROMPT_LEN = flags.DEFINE_integer("prompt_len", 6, "Prompt tokens.", lower_bound=1)
SHARD = flags.DEFINE_bool("shard", True, "Also one TP=2 shard on one device.")
OTHER = flags.DEFINE_string("other", "dots", "The form compared with model.Step(): dots "
                             "(Step.dots()) or KEY:VALUE,... fields of model.Step, e.g. "
                             "mv:pallas,pallas_products:gu+head (as profile_step.py's --step).")
CPU_DEVICES = flags.DEFINE_integer("cpu_devices", 2,
                                   "Host devices to force when there is no GPU.",
                                   lower_bound=1)


def compare(cfg, devices, seed: int, plen: int, steps: int,
            other: "model_lib.Step | None" = None) -> list[dict]:
  """Per step: rel (max |a - b| / max |a|), margin (a's top two apart, same
  scale), and the two greedy tokens, a the fused form's logits and b the
  other form's (default: the dots form's), both fed a's greedy tokens."""
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import Mesh
  mesh = Mesh(np.array(devices), ("tp",))
  prompt = jnp.asarray(np.random.default_rng(seed).integers(0, cfg.vocab, (1, plen)), jnp.int32)
  forms, firsts = [], []
  for step in (model_lib.Step(), other or model_lib.Step.dots()):
    m = model_lib.build(cfg, mesh, 1, plen + steps, step)
    params = m.init_params(0)
    first, cache = m.prefill()(params, prompt, m.init_cache())
    firsts.append(first)
    forms.append([params, m.step_logits(), cache])
  tok = firsts[0]  # both forms are fed the first form's greedy tokens
  rows = []
  for i in range(steps):
    out = []
    for form in forms:
      params, f, cache = form
      logits, form[2] = f(params, tok, cache, jnp.int32(plen + i))
      out.append(np.asarray(logits)[0])
    a, b = out
    top = np.sort(a)[-2:]
    scale = float(np.abs(a).max())
    rows.append({"rel": float(np.abs(a - b).max()) / scale,
                 "margin": float(top[1] - top[0]) / scale,
                 "tok_a": int(a.argmax()), "tok_b": int(b.argmax())})
    tok = jnp.asarray([a.argmax()], jnp.int32)
  return rows


def main() -> int:
  from jax_llar.tools import host
  if not host.gpu_present():
    changed = host.use_cpu(CPU_DEVICES.value)
    if changed:
      print("no GPU here: running on forced CPU devices (" + ", ".join(changed) + ")")
  import jax
  cfg = model_lib.PRESETS[PRESET.value]
  cases = [(f"TP={len(jax.devices())}", cfg, jax.devices())]
  if SHARD.value:
    cases.append(("one TP=2 shard", cfg.shard(2), jax.devices()[:1]))
  rows = []
  for label, c, devices in cases:
    for seed in range(SEEDS.value):
      for i, r in enumerate(compare(c, devices, seed, PROMPT_LEN.value, STEPS.value,
                                    model_lib.Step.parse(OTHER.value))):
        rows.append(r)
        print(f"{label:15s} seed {seed} step {i}: logits differ by {100 * r['rel']:.2f}%, "
              f"top two {100 * r['margin']:.2f}% apart, tokens {r['tok_a']} {r['tok_b']}")
  rel = [r["rel"] for r in rows]
  print(f"jax {jax.__version__}, {len(rows)} steps: logits differ by "
        f"{100 * min(rel):.2f}-{100 * max(rel):.2f}% of the largest; smallest top-two margin "
        f"{100 * min(r['margin'] for r in rows):.2f}%; greedy tokens differ at "
        f"{sum(r['tok_a'] != r['tok_b'] for r in rows)} step(s)")
  return 0


if __name__ == "__main__":
  from jax_llar.tools import _cli
  _cli.run(main)
