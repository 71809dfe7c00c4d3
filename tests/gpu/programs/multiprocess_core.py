"""The GPU suite's core cases, in one process per GPU or in one process for
all GPUs (issue 13). Started by tests/gpu/test_multiprocess.py:

  python -m jax_llar.tools.launch --nproc 2 -- multiprocess_core.py MODE [OUT.json]
  python multiprocess_core.py MODE [OUT.json]            (one process, all GPUs)

MODE ``core``: jax_llar.psum over a one-axis mesh of every GPU, for each
dtype (float32, bfloat16, float16, int32) and sizes from 4 bytes to 256 KiB
per rank, on random inputs that every process generates from the same seed;
each process checks its own shard bitwise against the float64 rank-order
sum rounded once (the single-process result is that too, so the modes are
bitwise equal) and that the dispatch log shows the fast path. Then the
per-step time of a chain of psum + multiply at 64, 1024 and 4096 bytes
(float32; the slope between 32 and 512 steps, median of 20 timed calls
each). Prints one JSON line per process; with OUT.json, process 0 also
writes it there.

MODE ``kill``: one good psum, then the last process exits at once
(``os._exit(9)``) and the others call psum again: they must end in
jax_llar's bounded-wait error within JAX_LLAR_TIMEOUT_MS (the caller sets
it), reported with the seconds it took.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import sys
import time

MULTI = "JAX_LLAR_PROCESS_ID" in os.environ
if MULTI:
  from jax_llar.tools import launch
  launch.initialize()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import jax_llar  # noqa: E402
from jax_llar import testing  # noqa: E402

MODE = sys.argv[1] if len(sys.argv) > 1 else "core"
OUT = sys.argv[2] if len(sys.argv) > 2 else None
mesh = Mesh(np.array(jax.devices()), ("x",))
world = mesh.size
sharding = NamedSharding(mesh, P("x"))
me = jax.process_index()
DTYPES = [np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16),
          np.dtype(np.int32)]
SIZES = [4, 64, 1000, 4096, 65536, 262144]


def global_array(per_rank: list[np.ndarray]) -> jax.Array:
  full = np.concatenate(per_rank)
  return jax.make_array_from_callback(full.shape, sharding, lambda idx: full[idx])


def mine(out: jax.Array) -> dict[int, np.ndarray]:
  """This process's shards of `out`, by rank (the shard's position)."""
  n = out.shape[0] // world
  return {s.index[0].start // n: np.asarray(s.data) for s in out.addressable_shards}


psum = jax.jit(jax.shard_map(lambda v: jax_llar.psum(v, "x"), mesh=mesh, in_specs=P("x"),
                             out_specs=P("x"), check_vma=False))


def chain(k: int):
  def body(v):
    for _ in range(k):
      v = jax_llar.psum(v, "x") * jnp.float32(1.0 / world)
    return v
  return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                               check_vma=False))


def per_step_us(nbytes: int) -> float:
  n = nbytes // 4
  x = global_array([np.full(n, r + 1, np.float32) for r in range(world)])
  fs, fl = chain(32), chain(512)
  fs(x).block_until_ready()
  fl(x).block_until_ready()

  def timed(f):
    t = []
    for _ in range(20):
      t0 = time.perf_counter()
      f(x).block_until_ready()
      t.append(time.perf_counter() - t0)
    return statistics.median(t)

  ts, tl = [], []
  for _ in range(3):  # interleaved rounds
    ts.append(timed(fs))
    tl.append(timed(fl))
  return (statistics.median(tl) - statistics.median(ts)) / (512 - 32) * 1e6


def core() -> dict:
  rng = np.random.default_rng(2026)
  cases, wrong, digests = 0, [], {}
  for dtype in DTYPES:
    for nbytes in SIZES:
      n = max(1, nbytes // dtype.itemsize)
      inputs = [testing.random_array(rng, (n,), dtype) for _ in range(world)]
      expect = testing.rank_order_sum(inputs, dtype)
      jax_llar.clear_dispatch_log()
      got = mine(psum(global_array(inputs)))
      fast = [d.fast for d in jax_llar.dispatch_log()]
      cases += 1
      for r, g in got.items():
        if not testing.bitwise_equal(g, expect, canonical_nans=True):
          wrong.append(f"{dtype} {nbytes} B rank {r}")
        # The output bits per (case, rank): the modes are compared on these.
        digests[f"{dtype} {nbytes} {r}"] = hashlib.sha256(g.tobytes()).hexdigest()[:16]
      if fast != [True]:
        wrong.append(f"{dtype} {nbytes} B: not the fast path ({jax_llar.dispatch_log()})")
  timing = {str(b): per_step_us(b) for b in (64, 1024, 4096)}
  return {"cases": cases, "wrong": wrong, "digests": digests, "us_per_step": timing}


def kill() -> dict:
  x = global_array([np.full(256, r + 1, np.float32) for r in range(world)])
  want = np.full(256, world * (world + 1) / 2, np.float32)
  first = all(np.array_equal(v, want) for v in mine(psum(x)).values())
  if me == jax.process_count() - 1 and jax.process_count() > 1:
    sys.stdout.flush()
    os._exit(9)  # a peer process dies
  t0 = time.monotonic()
  try:
    mine(psum(x + 1))
    return {"first_ok": first, "error": None, "seconds": time.monotonic() - t0}
  except Exception as e:  # the bounded-wait error (XlaRuntimeError)
    return {"first_ok": first, "error": f"{type(e).__name__}: {e}"[:1500],
            "seconds": time.monotonic() - t0, "reports": jax_llar.error_reports()[:4]}


result = {"mode": MODE, "multiprocess": MULTI, "process": me,
          "processes": jax.process_count(), "world": world}
result.update(core() if MODE == "core" else kill())
line = json.dumps(result)
print(line, flush=True)
if OUT and me == 0:
  with open(OUT, "w", encoding="utf-8") as f:
    f.write(line + "\n")
# A process whose CUDA context trapped (kill mode) must not run XLA's
# teardown: exit at once with the verdict printed.
os._exit(0)
