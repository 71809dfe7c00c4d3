"""Runs every Pallas kernel of this example once on small shapes and checks
each against the same kernel in its interpreter on the CPU backend (the
interpreters' arithmetic is what tests/test_examples.py checks against
float64): matvec.py (plain; residual add, RMSNorm factor and glu), mlp.py,
phases.py (with its last program's flags and with relays, each with few
programs and with more programs than the GPU holds at once, its wait's
premise), attention.py and matvec_mgpu.py. Meant to run under compute-sanitizer on a
GPU, where every kernel is compiled for the device:

  compute-sanitizer --tool memcheck --error-exitcode 9 \\
      python examples/tp_decode/kernels_check.py

Prints one line per kernel (largest difference over the largest magnitude)
and exits 1 when one is above its bound. Off GPUs both sides are the
interpreter (a smoke run of the script).
"""

from __future__ import annotations

import sys

from absl import app, flags

ONLY = flags.DEFINE_list("kernels", [], "Run only the checks whose names' first word is one "
                         "of these (e.g. mlp_phases: its four checks); empty: all.")

# Bounds on the largest difference over the largest magnitude, GPU against
# the interpreter: float32 sums in another order before one bfloat16 rounding
# (two for the glu product; mlp's float32 output has no last rounding).
BOUNDS = {"matvec": 2.0 ** -7, "matvec glu": 2.0 ** -6, "mlp": 2.0 ** -7,
          **{f"mlp_phases{v}": 2.0 ** -6 for v in ("", " many", " relay", " relay many")},
          "attention": 2.0 ** -6, "matvec_mgpu chain": 2.0 ** -6}


def main(argv):
  del argv
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.experimental.pallas import mosaic_gpu as plgpu
  import attention
  import matvec
  import matvec_mgpu
  import mlp
  import phases

  cpu = jax.devices("cpu")[0]
  on_gpu = jax.devices()[0].platform == "gpu"
  rng = np.random.default_rng(0)
  bf = jnp.bfloat16

  def rand(shape, scale=1.0):
    return np.asarray(jnp.asarray(rng.standard_normal(shape) * scale, bf))

  def both(fn, args, mosaic=False):
    """fn(*args, interpret=False) on the default device and fn(*args,
    interpret=True) on the CPU, as float64 arrays (Mosaic GPU's interpreter
    is a context, not an argument)."""
    on = lambda: [jnp.asarray(a) for a in args]  # on the default device
    dev = fn(*on()) if mosaic else fn(*on(), interpret=not on_gpu)
    with jax.default_device(cpu):
      if mosaic:
        with plgpu.force_gpu_interpret_mode(plgpu.InterpretGPUParams()):
          ref = fn(*on())
      else:
        ref = fn(*on(), interpret=True)
    flat = lambda t: [np.asarray(v, np.float64) for v in jax.tree.leaves(t)]
    return flat(dev), flat(ref)

  def wanted(name):
    return not ONLY.value or name.split()[0] in ONLY.value

  def report(name, dev, ref):
    err = max(float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30)) for a, b in zip(dev, ref))
    ok = err <= BOUNDS[name] and all(np.isfinite(a).all() for a in dev)
    print(f"{name:18s} {'ok' if ok else 'FAIL'}  {err:.2e} (bound {BOUNDS[name]:.1e})", flush=True)
    return ok

  results = []

  def check(name, run):
    """Runs `run` (-> device and interpreter outputs) and reports it, if wanted."""
    if wanted(name):
      results.append(report(name, *run()))

  m, n, k, eps = 1, 256, 512, 1e-5
  x, r = rand((m, k)), rand((m, k))
  w = rand((n, k), k ** -0.5)
  check("matvec", lambda: both(
      lambda x, w, interpret: matvec.matvec(x, w, tile_=matvec.Tile(4, 256), interpret=interpret),
      (x, w)))
  wgu = rand((2 * n, k), k ** -0.5)
  check("matvec glu", lambda: both(
      lambda x, r, w, interpret: matvec.matvec(x, w, residual=r, norm_eps=eps, glu=True,
                                               round_first=True, tile_=matvec.Tile(4, 256),
                                               interpret=interpret), (x, r, wgu)))
  wd_t = rand((n, k), n ** -0.5)
  check("mlp", lambda: both(
      lambda x, r, wgu, wd_t, interpret: mlp.mlp(x, wgu, wd_t, residual=r, norm_eps=eps,
                                                 rows=16, chunk=128, interpret=interpret),
      (x, r, wgu, wd_t)))

  def phased(d, f, r1, r2, relay=False):
    """mlp_phases on (d, f) with r1 / r2 rows a program; its sync slots
    must show no wait that timed out (a wrong output would show anyway)."""
    def run(x, r, wgu, wd, interpret):
      y, xs, sync = phases.mlp_phases(x, wgu, wd, phases.sync_buffer(3), 2, residual=r,
                                      norm_eps=eps, r1=r1, chunk1=min(d, 256), r2=r2,
                                      chunk2=min(f, 256), relay=relay, interpret=interpret)
      slots = np.asarray(sync).reshape(3, -1)
      if (int(phases.timeouts(sync)) or slots[2, 0] != f // r1
          or (slots[2, phases.LINE::phases.LINE] != 1).any() or slots[:2].any()):
        raise AssertionError(f"mlp_phases: slot 2 {slots[2, :40]}, counter {f // r1} expected")
      return y, xs
    return run, (rand((m, d)), rand((m, d)), rand((2 * f, d), d ** -0.5), rand((d, f), f ** -0.5))
  check("mlp_phases", lambda: both(*phased(k, n, 16, 8)))
  # 2048 + 1024 programs of 8 warps: more than H200's 132 multiprocessors
  # hold at once (at most 8 each), so phase-2 programs wait while phase-1
  # programs are still being handed out.
  check("mlp_phases many", lambda: both(*phased(1024, 2048, 1, 1)))
  check("mlp_phases relay", lambda: both(*phased(k, n, 16, 8, relay=True)))
  check("mlp_phases relay many", lambda: both(*phased(1024, 2048, 1, 1, relay=True)))
  kl, g, hd, length, pos = 2, 4, 64, 96, 40
  heads = kl * g
  half = hd // 2
  freq = (500000.0 ** (-np.arange(half, dtype=np.float32) / half)).astype(np.float32)
  qkv = rand((1, (heads + 2 * kl) * hd))
  cache = rand((1, kl, length, 2 * hd))
  check("attention", lambda: both(
      lambda qkv, cache, interpret: attention.decode_attention(
          qkv, cache, jnp.int32(pos), jnp.asarray(freq), heads=heads, interpret=interpret),
      (qkv, cache)))
  xt = np.zeros((8, k), np.float32)
  xt[0] = rng.standard_normal(k)
  xt = np.asarray(jnp.asarray(xt, bf))
  w2 = rand((n, k), k ** -0.5)
  w3 = rand((k, n), n ** -0.5)
  chain = lambda xt, w2, w3: matvec_mgpu.matvec_mgpu_chain(
      matvec_mgpu.matvec_mgpu_chain(xt, w2, rows_per_block=64, stages=3), w3,
      rows_per_block=64, stages=2)
  if on_gpu or not wanted("matvec_mgpu chain"):
    check("matvec_mgpu chain", lambda: both(chain, (xt, w2, w3), mosaic=True))
  else:
    print("matvec_mgpu chain  skipped: Mosaic GPU compiles for GPUs only", flush=True)
  sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
  app.run(main)
