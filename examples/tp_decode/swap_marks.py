"""Whether the swap's marks change XLA's compile of the decode step.

  python examples/tp_decode/swap_marks.py [--preset llama3.2-1b] [--shard_of 2] [--calls 20]
      (--preset: default small)

Run from the repository root. Inside ``jax_llar.swap_psum()`` every equation
traced carries JAX's XLA metadata ``jax_llar = "swap"`` (an
``mhlo.frontend_attributes`` entry on the multiplies and adds too, not only
on the psums). This compiles the decode program of main.py (a lax.scan of
--tokens tokens, lax.psum at every all-reduce site) for one device running
one TP=--shard_of shard, traced outside and inside a ``swap_psum()``
region, and compares: how many ops of the lowered program carry the mark,
the optimised HLO's kernels (fusions and custom calls) and fusions, whether
the optimised HLO is the same once frontend attributes and metadata are
removed, and the median time of --calls calls of each executable on the
same inputs (which must give the same tokens). Without a GPU it runs on one
forced CPU device, where XLA's fusion is not the GPU's.
Prints one line per program and a verdict; --json writes the figures. Exit
status 0.
"""

from __future__ import annotations

import json
import re
import statistics
import time

from absl import flags

import hlo_check
import model as model_lib

# --preset is hlo_check's flag (the same model widths).
SHARD_OF = flags.DEFINE_integer("shard_of", 2, "One TP=N shard's widths on one device.",
                                lower_bound=1)
TOKENS = flags.DEFINE_integer("tokens", 16, "Tokens per decode call.", lower_bound=1)
CALLS = flags.DEFINE_integer("calls", 20, "Timed calls per program.", lower_bound=1)
JSON = flags.DEFINE_string("json", None, "Write the figures to this file.")

_ATTRS = re.compile(r",?\s*(frontend_attributes|metadata)=\{[^{}]*(\{[^{}]*\}[^{}]*)*\}")


def _strip(hlo: str) -> str:
  """The program without frontend attributes, metadata and the trailing
  tables of source locations (FileNames, FunctionNames, FileLocations,
  StackFrames: where the tracing happened, which the region moves)."""
  cut = re.search(r"^(FileNames|FunctionNames|FileLocations|StackFrames)$", hlo, re.M)
  return _ATTRS.sub("", hlo[:cut.start()] if cut else hlo)


def main() -> int:
  from jax_llar.tools import host
  gpu = host.gpu_present()
  if not gpu:
    host.use_cpu(1)
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax import lax
  from jax.sharding import Mesh

  import jax_llar
  name = hlo_check.PRESET.value
  cfg = model_lib.PRESETS[name].shard(SHARD_OF.value) if SHARD_OF.value > 1 else (
      model_lib.PRESETS[name])
  mesh = Mesh(np.array(jax.devices()[:1]), ("tp",))
  m = model_lib.build(cfg, mesh, 1, 64 + TOKENS.value)
  params = m.init_params(0)
  n = TOKENS.value
  out = {"preset": name, "shard_of": SHARD_OF.value, "platform": jax.devices()[0].platform,
         "tokens": n, "programs": {}}
  compiled = {}
  for label in ("plain", "swap"):
    fn = m.decode_scan(lax.psum, n)
    args = (params, jnp.zeros((1,), jnp.int32), m.init_cache(), jnp.int32(64),
            jnp.zeros((n, 1), jnp.int32))
    if label == "swap":
      with jax_llar.swap_psum():
        lowered = fn.lower(*args)
    else:
      lowered = fn.lower(*args)
    text = lowered.as_text()
    exe = lowered.compile()
    hlo = exe.as_text()
    found = hlo_check.results(hlo)
    compiled[label] = (exe, hlo)
    out["programs"][label] = {
        "marked_ops": len(re.findall(r'jax_llar = "swap"', text)),
        "psum_ops": len(re.findall(r"all_reduce", text)),
        "kernels": sum(f["opcode"] in ("fusion", "custom-call") and f["output"] == 0
                       for f in found),
        "fusions": len(re.findall(r"= \S+ fusion\(", hlo))}
  out["same_hlo_without_attributes"] = (_strip(compiled["plain"][1]) ==
                                        _strip(compiled["swap"][1]))
  toks = {}
  for label, (exe, _) in compiled.items():
    times = []
    for _ in range(CALLS.value + 1):
      args = (params, jnp.zeros((1,), jnp.int32), m.init_cache(), jnp.int32(64),
              jnp.zeros((n, 1), jnp.int32))
      jax.block_until_ready(args)
      t0 = time.perf_counter()
      res = jax.block_until_ready(exe(*args))
      times.append((time.perf_counter() - t0) / n * 1e6)
    toks[label] = np.asarray(res[0])
    out["programs"][label]["itl_us_median"] = statistics.median(times[1:])
  out["tokens_agree"] = bool(np.array_equal(toks["plain"], toks["swap"]))
  for label, r in out["programs"].items():
    print(f"{label:5s}: {r['marked_ops']} marked ops ({r['psum_ops']} all-reduces), "
          f"{r['kernels']} kernels, {r['fusions']} fusions, "
          f"{r['itl_us_median']:.1f} us per token (median of {CALLS.value})")
  a, b = out["programs"]["plain"], out["programs"]["swap"]
  changed = (a["kernels"] != b["kernels"] or a["fusions"] != b["fusions"] or
             not out["same_hlo_without_attributes"])
  out["marks_change_compile"] = changed
  print(f"{name}, one TP={SHARD_OF.value} shard on {out['platform']}: the marks "
        f"{'CHANGE' if changed else 'do not change'} XLA's optimised program "
        f"(same HLO without attributes: {out['same_hlo_without_attributes']}); "
        f"tokens agree: {out['tokens_agree']}; swap/plain time "
        f"{b['itl_us_median'] / a['itl_us_median']:.3f}x")
  if JSON.value:
    with open(JSON.value, "w") as f:
      json.dump(out, f, indent=1)
  return 0


if __name__ == "__main__":
  from jax_llar.tools import _cli
  _cli.run(main)
