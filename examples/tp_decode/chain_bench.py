"""Chains of dependent matrix-vector products on one GPU: XLA's reduction
form (model._mv's) and XLA's dot against the Mosaic GPU chain kernel
(matvec_mgpu.py) with and without programmatic dependent launch (PDL); an
experiment of issue 27 (benchmarks/NOTES.md entries 77, 79, 81-84).

  python examples/tp_decode/chain_bench.py [--kinds=1b,small,8b] [--forms=a,c,d]
  python examples/tp_decode/chain_bench.py --cpu_smoke   (interpret mode, tiny shapes)
  python examples/tp_decode/chain_bench.py --mlp [--kinds=1b,8b]   (the MLP, entry 79)

A chain is one jitted program y_{i+1} = y_i w_i^T (bfloat16 in and out), each
product with weights of its own, so that the next product cannot start before
the last one's output exists; with no XLA op between two Mosaic kernels
(their (8, N) layout feeds the next one as it is). Kinds: "1b" 16 x [(4096,
2048), (2048, 4096)] (16.8 MB a product, the 1B shard's down-sized products),
"small" 32 x (2048, 2048) (8.4 MB), "8b" 8 x [(7168, 4096), (4096, 7168)]
(58.7 MB); every chain's weights are well above the 50 MB L2. Time: the span
of a call's kernels on the device (first start to last end) from a profiler
trace, median of --calls calls, for the whole chain and its first half; per
product = the difference / the products between them (a call's start cancels).
``busy/span`` is the sum of the kernels' durations over the span: above 1 the
kernels overlapped (PDL let one start before the last ended). Every form's
last output is compared with form a's on the same random data (scaled 1/sqrt(K)).

With --mlp the chain's links are MLP blocks of one TP=2 shard (1b: D 2048, F
4096, 50.3 MB a block, 8 blocks; 8b: D 4096, F 7168, 176.2 MB, 4 blocks), x
-> down(silu(gate x') * up x') with x' the RMSNorm'd x (its factor applied to
the products, as the step does): form a XLA's reduction form (model._mv: gate
and up with the sum of squares in one reduction, the SiLU, the down product),
b matvec.py's two Pallas kernels, c.. mlp.py's one kernel (rows x chunk x
warps), its float32 output fed to the next block as it is (a and b round it
to bfloat16 first), p0.. phases.py's kernel of two product phases
(--phase_tiles, phases.parse_tile's form; entries 81-84), each block with a sync slot of its own, the
chain's output NaN if any wait timed out.
"""

from __future__ import annotations

import contextlib
import functools
import json
import statistics
import time

from absl import app, flags

KINDS = flags.DEFINE_list("kinds", [], "Chains to run (empty: all of the mode's: 1b, small "
                          "and 8b; with --mlp 1b and 8b).")
FORMS = flags.DEFINE_list("forms", [], "Form letters to run (empty: all).")
CALLS = flags.DEFINE_integer("calls", 5, "Profiled calls per chain.", lower_bound=1)
FFI_PDL = flags.DEFINE_boolean(
    "ffi_uses_pdl", False, "Also put uses_pdl=True into the Mosaic GPU custom calls' "
    "backend config (XLA's custom-call thunk reads it to launch with PDL; JAX 0.11.2 sets "
    "only a module attribute); for forms whose kernels wait (pdl True or early) only.")
CPU_SMOKE = flags.DEFINE_boolean("cpu_smoke", False, "Interpret mode, tiny shapes.")
JSON_F = flags.DEFINE_string("json", None, "Write the rows here.")
MLP = flags.DEFINE_boolean("mlp", False, "Chains of MLP blocks (mlp.py) in place of products.")
MLP_TILES = flags.DEFINE_list("mlp_tiles", ["16x256x8", "32x256x8", "32x128x8", "16x128x4"],
                              "mlp.py's rows x chunk x warps to try (--mlp).")
PHASE_TILES = flags.DEFINE_list(
    "phase_tiles", ["2x2048x2x512x4x0x0", "2x2048x2x512x4x0x0xrelay", "2x2048x2x512x4x0x0xnosync",
                    "2x2048x1x1024x4xallx0xrelay", "2x2048x2x512x4x4x0xrelay"],
    "phases.py's r1 x chunk1 x r2 x chunk2 x warps x pre_chunks ('all' or a count) x "
    "sleep_ns [x relay | x nosync: unsynchronized, a timing bound with a wrong output] to try "
    "(--mlp; default: entry 84's); a tile that does not divide a kind's shapes is a row "
    "with its error.")

READ_FLOOR = flags.DEFINE_float(
    "read_floor_gbs", 4673.0, "The read bandwidth the printed fractions are of, GB/s "
    "(default: one H200's, from a bfloat16 sum's kernels; benchmarks/NOTES.md entry 76).")


def kinds(smoke: bool) -> dict:
  """Per chain kind, its products' (N, K), N_i = K_{i+1}."""
  if smoke:
    return {"1b": [(256, 128), (128, 256)] * 2, "small": [(128, 128)] * 3,
            "8b": [(384, 256), (256, 384)]}
  return {"1b": [(4096, 2048), (2048, 4096)] * 16, "small": [(2048, 2048)] * 32,
          "8b": [(7168, 4096), (4096, 7168)] * 8}


def mlp_kinds(smoke: bool) -> dict:
  """(D, F, blocks) per kind."""
  if smoke:
    return {"1b": (256, 64, 3), "8b": (256, 128, 2)}
  return {"1b": (2048, 4096, 8), "8b": (4096, 7168, 4)}


def mlp_forms(smoke: bool) -> list:
  """(letter, name, block(x, wgu, wd, wd_t) -> next x) per form."""
  import jax.numpy as jnp
  import matvec
  import mlp
  import model
  import phases
  bf16, eps = jnp.bfloat16, 1e-5

  def xla(x, wgu, wd, wd_t):
    del wd_t
    return model.reduce_product(model.glu(*model.reduce_glu_parts(x, wgu, eps)), wd)

  interp = smoke

  def pallas2(x, wgu, wd, wd_t):
    del wd_t
    m = matvec.matvec(x.astype(bf16), wgu, norm_eps=eps, glu=True, round_first=True,
                      interpret=interp)
    return matvec.matvec(m, wd, interpret=interp)

  def fused(rows, chunk, warps):
    def block(x, wgu, wd, wd_t):
      del wd
      return mlp.mlp(x, wgu, wd_t, norm_eps=eps, rows=rows, chunk=chunk, warps=warps,
                     interpret=interp)
    return block

  def phased(spec):
    kw = phases.parse_tile(spec)

    def block(x, wgu, wd, wd_t, sync, slot):
      del wd_t
      return phases.mlp_phases(x.astype(bf16), wgu, wd, sync, slot, norm_eps=eps,
                               interpret=interp, **kw)
    block.needs_sync = True
    return block

  out = [("a", "xla reduce", xla), ("b", "pallas 2 kernels", pallas2)]
  tiles = ["16x64x4"] if smoke else MLP_TILES.value
  for i, t in enumerate(tiles):
    rows, chunk, warps = (int(v) for v in t.split("x"))
    out.append((chr(ord("c") + i), f"mlp {t}", fused(rows, chunk, warps)))
  ptiles = (["16x64x16x32x4xallx0", "16x64x16x32x4x1x0xrelay"] if smoke
            else PHASE_TILES.value)
  for i, t in enumerate(ptiles):
    out.append((f"p{i}", f"phases {t}", phased(t)))
  return out


def main_mlp(chosen: list) -> None:
  """The --mlp chains of the kinds `chosen` (mlp_kinds' keys)."""
  import jax
  import jax.numpy as jnp
  from phases import sync_buffer as phases_sync, timeouts as phases_timeouts
  smoke = CPU_SMOKE.value
  fs = [f for f in mlp_forms(smoke) if not FORMS.value or f[0] in FORMS.value]
  print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}; MLP blocks: us per block "
        f"(GB/s, fraction of {READ_FLOOR.value:.0f}) | whole and half chain us | busy/span | "
        "error against a", flush=True)
  rows = []
  for kind in chosen:
    d, f, nb = mlp_kinds(smoke)[kind]
    key = jax.random.key(1)
    rnd = lambda i, shape, k: (jax.random.normal(jax.random.fold_in(key, i), shape, jnp.float32)
                               * k ** -0.5).astype(jnp.bfloat16)
    blocks = []
    for i in range(nb):
      wgu, wd = rnd(3 * i, (2 * f, d), d), rnd(3 * i + 1, (d, f), f)
      blocks.append((wgu, wd, jnp.asarray(wd.T)))
    x = jax.random.normal(jax.random.fold_in(key, 999), (1, d), jnp.float32).astype(jnp.bfloat16)
    h = nb // 2
    block_bytes = 2 * (3 * d * f)
    flat = [w for b in blocks for w in b]
    ref = None
    for letter, name, block in fs:
      def chain(v, *ws, block=block):
        if not getattr(block, "needs_sync", False):
          for i in range(0, len(ws), 3):
            v = block(v, *ws[i:i + 3])
          return v
        # One sync slot a block, zeroed once a chain; a wait that timed out
        # makes the chain's output NaN (the row's error shows it).
        sync = phases_sync(len(ws) // 3)
        for i in range(0, len(ws), 3):
          v, sync = block(v, *ws[i:i + 3], sync, i // 3)
        return jnp.where(phases_timeouts(sync) > 0, jnp.nan, v.astype(jnp.float32))
      row = {"kind": kind, "form": letter, "name": name, "blocks": nb, "mlp": True}
      ref = _time_chain(row, "us_per_block", chain, (x, *flat), (x, *flat[:3 * h]), nb - h,
                        block_bytes * (nb - h), ref, contextlib.nullcontext)
      rows.append(row)
  _write(rows)


def forms(smoke: bool) -> list:
  """(letter, name, product, takes (8, K)) per form."""
  import jax.numpy as jnp
  import matvec_mgpu as mm
  import model

  def dot_form(x, w):
    return jnp.dot(x, w.T, preferred_element_type=jnp.float32).astype(jnp.bfloat16)

  mg = lambda **kw: functools.partial(mm.matvec_mgpu_chain, **kw)
  extra = dict(rows_per_block=64) if smoke else {}
  wide = dict(tile_k=128) if smoke else dict(tile_k=256)  # the smoke shapes' K is 128-384
  return [("a", "xla reduce", model.reduce_product, False), ("b", "xla dot", dot_form, False),
          ("c", "mgpu pdl", mg(pdl=True, **extra), True),
          ("d", "mgpu no pdl", mg(pdl=False, **extra), True),
          ("e", "mgpu pdl early", mg(pdl="early", **extra), True),
          ("f", "mgpu pdl 8 stages", mg(pdl=True, stages=8, **extra), True),
          ("g", f"mgpu pdl tile_k {wide['tile_k']}", mg(pdl=True, **wide, **extra), True)]


def device_span(fn, args, calls: int) -> tuple[float, float]:
  """(span, busy/span) of one call of fn on the device, seconds: the median
  over `calls` profiled calls (2 ms apart) of first kernel start to last
  kernel end, and the median sum of kernel durations over it. Host-timed
  off GPUs (busy/span nan)."""
  import jax
  if jax.devices()[0].platform != "gpu":
    t = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - t, float("nan")
  from jax_llar.tools import traces

  def run():
    for _ in range(calls):
      jax.block_until_ready(fn(*args))
      time.sleep(0.002)
  groups = traces.device_calls(traces.profile(run, calls=1))
  spans = [max(e.ts + e.dur for e in g) - g[0].ts for g in groups]
  busy = [sum(e.dur for e in g) for g in groups]
  return statistics.median(spans) * 1e-6, statistics.median(busy) / statistics.median(spans)


def _time_chain(row: dict, per_key: str, chain, whole_args: tuple, half_args: tuple,
                links: int, link_bytes: int, ref, context):
  """Times the chain `chain` (the links of a kind, one link a step) as one
  jitted program on `whole_args` and on `half_args` (the first links only)
  by `device_span`, under `context` (an interpreter's, or a null one), and
  fills `row`: row[per_key] the microseconds a link between the two,
  `links` of them moving `link_bytes` weight bytes in all (gbs), the two
  spans, busy/span, and the error of the whole chain's first output row
  against `ref` (None: this form is the reference). A form that fails is a
  row with error_text. Prints the row; returns the reference for the
  forms after it."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  label = f"{row['kind']:5s} {row['form']} {row['name']:20s}"
  try:
    whole, half = jax.jit(chain), jax.jit(chain)
    with context():
      y = np.asarray(whole(*whole_args)[:1].astype(jnp.float32))
      jax.block_until_ready(half(*half_args))
      t_whole, busy = device_span(whole, whole_args, CALLS.value)
      t_half, _ = device_span(half, half_args, CALLS.value)
  except Exception as e:  # a form that does not build is a row, not the end
    row["error_text"] = f"{type(e).__name__}: {str(e)[:400]}"
    print(f"{label} FAILED {row['error_text']}", flush=True)
    return ref
  ref = y if ref is None else ref
  row.update({per_key: (t_whole - t_half) / links * 1e6}, whole_us=t_whole * 1e6,
             half_us=t_half * 1e6, gbs=link_bytes / (t_whole - t_half) / 1e9,
             busy_over_span=busy, error=float(np.abs(y - ref).max() / np.abs(ref).max()))
  print(f"{label} {row[per_key]:7.2f} us ({row['gbs']:5.0f} GB/s, "
        f"{row['gbs'] / READ_FLOOR.value:.2f}) | {row['whole_us']:7.1f} {row['half_us']:7.1f} | "
        f"{busy:.3f} | {row['error']:.1e}", flush=True)
  return ref


def _write(rows: list) -> None:
  """The rows to --json, when given."""
  import jax
  if JSON_F.value:
    with open(JSON_F.value, "w") as f:
      json.dump({"rows": rows, "device": str(jax.devices()[0].device_kind)}, f, indent=1)


def _mark_ffi_pdl() -> None:
  """Adds uses_pdl=True to every mosaic_gpu_v2 custom call lowered from now on."""
  import jax.experimental.mosaic.gpu.core as mcore
  from jaxlib.mlir import ir
  orig = mcore.mlir.custom_call

  def custom_call(*args, **kw):
    if kw.get("call_target_name") == "mosaic_gpu_v2":
      kw["backend_config"] = dict(kw["backend_config"], uses_pdl=ir.BoolAttr.get(True))
    return orig(*args, **kw)
  mcore.mlir.custom_call = custom_call


def main(argv):
  del argv
  known = mlp_kinds(False) if MLP.value else kinds(False)
  chosen = KINDS.value or list(known)
  unknown = sorted(set(chosen) - set(known))
  if unknown:
    raise app.UsageError(f"--kinds: unknown {unknown}; known: {', '.join(known)}")
  if MLP.value:
    if FFI_PDL.value:
      raise app.UsageError("--ffi_uses_pdl applies to the Mosaic GPU chains, not --mlp")
    main_mlp(chosen)
    return
  import jax
  import jax.numpy as jnp
  from jax.experimental.pallas import mosaic_gpu as plgpu
  smoke = CPU_SMOKE.value
  fs = [f for f in forms(smoke) if not FORMS.value or f[0] in FORMS.value]
  if FFI_PDL.value:
    if any(letter == "d" for letter, *_ in fs):
      raise app.UsageError("--ffi_uses_pdl: form d's kernels do not wait; leave it out")
    _mark_ffi_pdl()
  interp = ((lambda: plgpu.force_gpu_interpret_mode(plgpu.InterpretGPUParams())) if smoke
            else contextlib.nullcontext)
  print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}, ffi_uses_pdl "
        f"{FFI_PDL.value}; us per product (GB/s, fraction of {READ_FLOOR.value:.0f}) | "
        "whole and half chain us | busy/span | error against a", flush=True)
  rows = []
  for kind in chosen:
    dims = kinds(smoke)[kind]
    p, h = len(dims), len(dims) // 2
    key = jax.random.key(0)
    ws = [(jax.random.normal(jax.random.fold_in(key, i), (n, k), jnp.float32)
           * k ** -0.5).astype(jnp.bfloat16) for i, (n, k) in enumerate(dims)]
    x = jax.random.normal(jax.random.fold_in(key, 999), (1, dims[0][1]),
                          jnp.float32).astype(jnp.bfloat16)
    xt = jnp.zeros((8, dims[0][1]), jnp.bfloat16).at[:1].set(x)
    extra_bytes = sum(2 * n * k for n, k in dims[h:])
    ref = None
    for letter, name, product, padded in fs:
      def chain(v, *w, product=product):
        for wi in w:
          v = product(v, wi)
        return v
      row = {"kind": kind, "form": letter, "name": name, "products": p,
             "ffi_uses_pdl": FFI_PDL.value}
      inp = xt if padded else x
      ref = _time_chain(row, "us_per_product", chain, (inp, *ws), (inp, *ws[:h]), p - h,
                        extra_bytes, ref, interp)
      rows.append(row)
    del ws
  _write(rows)


if __name__ == "__main__":
  app.run(main)
