"""The decode step's matrix-vector products, Pallas (matvec.py) against XLA's
reduction form (model._mv), on one device: device time per product and the
bandwidth it reads the weights at, for tiles given on the command line.

  python examples/tp_decode/matvec_bench.py --presets=llama3.2-1b,llama3-8b \
      --products=qkv,o,gu,down,head --rows=1,2,4,8 --chunks=512,1024 --warps=4,8

Each product is one TP=2 shard's (`--shard_of`) with the work the step
folds into it (qkv and gu: the residual add and the RMSNorm factor; gu: the
SiLU). Each form runs on `copies` different weight arrays of the product's
shape in one jitted program (at least --bytes in all, so that no product
reads its weights from the 50 MB L2 a previous one left them in), separated
by optimisation barriers; the profiler's kernels give the device time per
product (the sum of the program's kernel durations over copies) and the
span (first kernel's start to last kernel's end, over copies: with the
gaps between kernels). Every Pallas output is checked against the XLA
form's on random data in the same run (largest difference over the largest
magnitude, at most --tolerance). Prints one line per (product, form) and
writes them to --json.
"""

from __future__ import annotations

import json
import math
import time
import zlib

from absl import app, flags

PRESETS_F = flags.DEFINE_list("presets", ["llama3.2-1b"], "Models whose products to measure.")
PRODUCTS_F = flags.DEFINE_list("products", ["qkv", "o", "gu", "down", "head"], "Products.")
SHARD_OF = flags.DEFINE_integer("shard_of", 2, "The tensor-parallel size whose shard to run.")
ROWS = flags.DEFINE_list("rows", [], "Tile rows to try (empty: matvec.tile's only).")
CHUNKS = flags.DEFINE_list("chunks", [], "Tile chunks to try.")
WARPS = flags.DEFINE_list("warps", ["4"], "Warps to try.")
MAX_ACC = flags.DEFINE_integer("max_acc", 16384, "Skip tiles with more partial sums.")
BYTES = flags.DEFINE_integer("bytes", 512 << 20, "Weight bytes per program, at least.")
CALLS = flags.DEFINE_integer("calls", 3, "Profiled calls per form.")
TOLERANCE = flags.DEFINE_float("tolerance", 2e-2, "Largest relative difference allowed.")
MAX_SECONDS = flags.DEFINE_integer("max_seconds", 0, "Stop starting forms after this (0: none).")
JSON_F = flags.DEFINE_string("json", None, "Write the rows here.")
SWEEP = flags.DEFINE_boolean("sweep", False, "Try the tiles of `sweep_tiles` (in place of "
                             "--rows, --chunks and --warps).")
BEST_OUT = flags.DEFINE_string("best_out", None, "Write the fastest correct tile per shape "
                               "here, as matvec.load_tiles reads it (MATVEC_TILES).")


def sweep_tiles(n: int, k: int, glu: bool) -> list:
  """The tiles --sweep tries for an (n, k) product: rows 1-8 and chunks of
  512-2048 columns whose partial sums hold 2048-16384 elements, at 4 warps
  (and 8 from 8192 elements), unrolled; and two of them as pipelined loops
  (3 stages)."""
  import matvec
  out = []
  for rows in (1, 2, 4, 8):
    for chunk in (512, 1024, 2048):
      e = rows * chunk * (2 if glu else 1)
      if n % rows or k % chunk or not 2048 <= e <= 16384:
        continue
      out += [matvec.Tile(rows, chunk, w) for w in (4, 8) if w == 4 or e >= 8192]
  out += [matvec.Tile(r, 1024, 4, 3) for r in (2, 4) if n % r == 0 and k % 1024 == 0]
  return out


def shapes(cfg, tp: int) -> dict:
  """Per product: (N, K, kind) of one device's weight (N rows of K)."""
  hd, d = cfg.head_dim, cfg.d_model
  nqkv = (cfg.n_heads + 2 * cfg.n_kv_heads) * hd // tp
  return {"qkv": (nqkv, d, "norm"), "o": (d, cfg.n_heads * hd // tp, "plain"),
          "gu": (2 * cfg.d_ff // tp, d, "glu"), "down": (d, cfg.d_ff // tp, "plain"),
          "head": (cfg.vocab // tp, d, "head")}


def main(argv):
  del argv
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax import lax

  import matvec
  import model
  from jax_llar.tools import traces

  eps = 1e-5
  rows_out, best = [], {}
  t_start = time.time()
  on_gpu = jax.devices()[0].platform == "gpu"

  def xla_form(kind, n):
    """The step's own "reduce" form of the product (model.py's functions)."""
    del n

    def f(x, r, w):
      if kind == "glu":
        xs = x + r
        return model.glu(*model.reduce_glu_parts(xs, w, eps)), xs
      if kind == "norm":
        xs = x + r
        return model.reduce_normed(xs, w, eps), xs
      if kind == "head":
        return model.reduce_normed(x, w, eps, round_first=False), x
      return model.reduce_product(x, w), x
    return f

  interp = not on_gpu

  def pallas_form(kind, t):
    def f(x, r, w):
      if kind == "norm":
        return matvec.matvec(x, w, residual=r, norm_eps=eps, round_first=True,
                             out_dtype=jnp.float32, tile_=t, interpret=interp)
      if kind == "glu":
        return matvec.matvec(x, w, residual=r, norm_eps=eps, glu=True, round_first=True,
                             tile_=t, interpret=interp)
      if kind == "head":
        return matvec.matvec(x, w, norm_eps=eps, out_dtype=jnp.float32, tile_=t, interpret=interp), x
      return matvec.matvec(x, w, tile_=t, interpret=interp), x
    return f

  def chain(form, copies):
    """The form over every copy, each a kernel group of its own."""
    def prog(x, r, ws):
      outs = []
      for i in range(copies):
        y, xs = form(x, r, ws[i])
        outs.append(y)
        x, r = lax.optimization_barrier((x, r))
      return outs, xs
    return jax.jit(prog)

  def timed_all(fns, args, copies):
    """Per fn: {"device_us", "span_us", "kernels_per_call"}, the median of
    its --calls calls, all traced in one profiler session; calls are told
    apart by a 2 ms host pause after each."""
    if not on_gpu or not fns:
      return [{} for _ in fns]

    def run_all():
      for fn in fns:
        for _ in range(CALLS.value):
          jax.block_until_ready(fn(*args))
          time.sleep(0.002)

    calls = traces.device_calls(traces.profile(run_all, calls=1))
    if len(calls) != len(fns) * CALLS.value:
      print(f"timing: {len(calls)} calls in the trace, {len(fns) * CALLS.value} made: "
            "not timed", flush=True)
      return [{} for _ in fns]
    out = []
    for i in range(len(fns)):
      per = sorted((sum(e.dur for e in c) / copies,
                    (max(e.ts + e.dur for e in c) - c[0].ts) / copies, len(c))
                   for c in calls[i * CALLS.value:(i + 1) * CALLS.value])
      dev, span, kernels = per[len(per) // 2]
      out.append({"device_us": dev, "span_us": span, "kernels_per_call": kernels})
    return out

  for preset in PRESETS_F.value:
    cfg = model.PRESETS[preset]
    for name in PRODUCTS_F.value:
      n, k, kind = shapes(cfg, SHARD_OF.value)[name]
      nbytes = n * k * 2
      copies = max(2, math.ceil(BYTES.value / nbytes))
      key = jax.random.key(zlib.crc32(f"{preset} {name}".encode()))  # the same every run
      kx, kr, kw = jax.random.split(key, 3)
      x = jax.random.normal(kx, (1, k), jnp.bfloat16)
      r = jax.random.normal(kr, (1, k), jnp.bfloat16)
      ws = [jax.random.normal(jax.random.fold_in(kw, i), (n, k), jnp.bfloat16) * k ** -0.5
            for i in range(copies)]
      ref_fn = chain(xla_form(kind, n), copies)
      ref, ref_xs = jax.block_until_ready(ref_fn(x, r, ws))
      nout = n // 2 if kind == "glu" else n
      if not on_gpu and SWEEP.value:
        print(f"{preset} {name}: {len(sweep_tiles(nout, k, kind == 'glu'))} tiles", flush=True)
      forms = [("xla", None)]
      glu = kind == "glu"
      if SWEEP.value:
        forms += [("pallas", t) for t in sweep_tiles(nout, k, glu)]
      else:
        t0 = matvec.tile(nout, k, glu)
        for rows in [int(v) for v in ROWS.value] or [t0.rows]:
          for chunk in [int(v) for v in CHUNKS.value] or [t0.chunk]:
            for warps in (int(v) for v in WARPS.value):
              t = matvec.Tile(rows, chunk, warps)
              if nout % t.rows or k % t.chunk or t.rows * t.chunk * (1 + glu) > MAX_ACC.value:
                continue
              forms.append(("pallas", t))
      # Compile and check every form first, then time them all in one
      # profiler trace (its start and stop cost more than the runs).
      pending = []
      for form, t in forms:
        if MAX_SECONDS.value and time.time() - t_start > MAX_SECONDS.value:
          print(f"stopped at --max_seconds={MAX_SECONDS.value}", flush=True)
          break
        row = {"preset": preset, "product": name, "n": n, "k": k, "kind": kind,
               "weight_bytes": nbytes, "copies": copies, "form": form,
               "tile": None if t is None else [t.rows, t.chunk, t.warps, t.stages]}
        try:
          if form == "xla":
            fn = ref_fn
          else:
            fn = chain(pallas_form(kind, t), copies)
            out, xs = jax.block_until_ready(fn(x, r, ws))
            a = np.stack([np.asarray(o, np.float32) for o in out])
            b = np.stack([np.asarray(o, np.float32) for o in ref])
            row["max_rel_diff"] = float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))
            row["residual_equal"] = bool(np.array_equal(np.asarray(xs, np.float32),
                                                        np.asarray(ref_xs, np.float32)))
            row["ok"] = row["max_rel_diff"] <= TOLERANCE.value and row["residual_equal"]
          pending.append((row, fn, t))
        except Exception as e:  # a tile Triton cannot compile is a row, not the end
          row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
          rows_out.append(row)
          print(json.dumps(row), flush=True)
      for (row, fn, t), tm in zip(pending, timed_all([p[1] for p in pending], (x, r, ws),
                                                     copies)):
        row.update(tm)
        if "device_us" in row:
          row["device_gbs"] = nbytes / row["device_us"] / 1e3
          row["span_gbs"] = nbytes / row["span_us"] / 1e3
        rows_out.append(row)
        print(json.dumps(row), flush=True)
        if row["form"] == "pallas" and row.get("ok") and "device_us" in row:
          key = f"{nout},{k},{kind == 'glu'}"
          if key not in best or row["device_us"] < best[key][1]:
            best[key] = ([t.rows, t.chunk, t.warps, t.stages], row["device_us"])
  if BEST_OUT.value:
    with open(BEST_OUT.value, "w") as f:
      json.dump({key: v[0] for key, v in best.items()}, f, indent=1)
    print("best tiles:", json.dumps(best), flush=True)
  if JSON_F.value:
    with open(JSON_F.value, "w") as f:
      json.dump({"rows": rows_out, "devices": [str(d) for d in jax.devices()[:1]]}, f, indent=1)


if __name__ == "__main__":
  app.run(main)
