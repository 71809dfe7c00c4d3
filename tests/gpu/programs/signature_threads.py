"""Issue 12 (call signatures): two Python threads hammer two different
programs on the same devices, CALLS executions each (default 100000): thread
0 a psum of 1000 float32 per rank, thread 1 two psums of 700 bfloat16 per
rank in one program (the second of twice the first's output: exact). XLA
gives no cross-device order between the two threads' custom calls, so the
GPUs may pair one program's call with the other's. Every output is checked bitwise against the float64 rank-order
reference; a mispairing must end in the foreign-signature error (code 2),
never in a wrong sum.

    python signature_threads.py [CALLS]

Prints {"fast", "calls" (executions that returned, per thread), "wrong"
(outputs that were not the reference: must be 0), "errors" (at most 3),
"reports" (jax_llar.error_reports()), "signatures" (of each program's
calls), "hung" (a thread still alive after the deadline)}. Run with a short
JAX_LLAR_TIMEOUT_MS: after a mispairing the CUDA context is lost and every
later call fails at once.
"""

import sys
import threading
import time

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

import jax_llar
from jax_llar import signature, testing

from _prelude import emit, fast, mesh, shard_jit, sharding

CALLS = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
DEADLINE_S = 1500
rng = np.random.default_rng(12)
BF16 = np.dtype(ml_dtypes.bfloat16)

# Program 0: one psum, 1000 float32 per rank. Program 1: two psums of 700
# bfloat16 per rank (the second of twice the first's output, an exact step).
ins0 = [testing.random_array(rng, (1000,), np.float32) for _ in range(mesh.size)]
ins1 = [testing.random_array(rng, (700,), BF16) for _ in range(mesh.size)]
want0 = testing.rank_order_sum(ins0, np.float32)
first = testing.rank_order_sum(ins1, BF16)
want1 = testing.rank_order_sum([(first.astype(np.float32) * 2).astype(BF16)] * mesh.size,
                               BF16)
prog0 = shard_jit(lambda v: jax_llar.psum(v, "x"))
prog1 = shard_jit(lambda v: jax_llar.psum(jax_llar.psum(v, "x") * jnp.asarray(2, v.dtype),
                                          "x"))
x0 = jax.device_put(np.stack(ins0), sharding)
x1 = jax.device_put(np.stack(ins1), sharding)
out0, out1 = np.asarray(prog0(x0)), np.asarray(prog1(x1))  # compile, check once
# Outputs are (ranks, n): rank r's block is row r.
ok_first = all(testing.bitwise_equal(out0[r], want0) and testing.bitwise_equal(out1[r], want1)
               for r in range(mesh.size))

calls = [0, 0]
wrong = [0, 0]
errors = []
stop = threading.Event()


def worker(i, prog, x, want):
  u = np.uint32 if want.dtype.itemsize == 4 else np.uint16
  want_bits = np.tile(want.view(u), (mesh.size, 1))
  try:
    for _ in range(CALLS):
      if stop.is_set():
        return
      out = np.asarray(prog(x))
      calls[i] += 1
      if not np.array_equal(out.view(u), want_bits):
        wrong[i] += 1
  except Exception as e:  # noqa: BLE001 - the error is an accepted outcome
    errors.append(f"thread {i}: {type(e).__name__}: {str(e)[:300]}")
    stop.set()


threads = [threading.Thread(target=worker, args=(0, prog0, x0, want0)),
           threading.Thread(target=worker, args=(1, prog1, x1, want1))]
t0 = time.monotonic()
for t in threads:
  t.start()
for t in threads:
  t.join(timeout=max(1.0, DEADLINE_S - (time.monotonic() - t0)))
sigs = {str(k): [c.op_name for c in v] for k, v in signature.lowered().items()}
emit({"fast": fast(), "ok_first": ok_first, "calls": calls, "wrong": sum(wrong),
      "errors": errors[:3], "reports": jax_llar.error_reports(), "signatures": sigs,
      "hung": any(t.is_alive() for t in threads),
      "seconds": round(time.monotonic() - t0, 1)})
