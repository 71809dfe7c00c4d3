"""Issue 12 (call signatures): a rank-dependent extra call followed by more
calls. Only rank 0 runs the psum inside the lax.cond; both ranks then run two
more psums of the same shape, so rank 1's next psum pairs with rank 0's
extra one, and every later call stays paired off by one. The call must fail
with the foreign-signature error (code 2), naming both calls' signatures,
never return wrong sums. Run with a short JAX_LLAR_TIMEOUT_MS (a report
that only comes with the timeout is code 1, not the signature error).

Prints {"fast", "error" (None, or {"type", "message"}), "out_ok" (when no
error: every rank's output is the reference), "reports"
(jax_llar.error_reports()), "signatures" (signature -> op names of the
calls lowered here)}.
"""

import numpy as np
from jax import lax

import jax_llar
from jax_llar import signature, testing

from _prelude import emit, fast, mesh, shard_jit, x


def step(v):
  a = jax_llar.psum(v, "x")
  b = lax.cond(lax.axis_index("x") == 0, lambda u: jax_llar.psum(u, "x"),
               lambda u: u * 2, a)
  c = jax_llar.psum(b + 1, "x")
  return jax_llar.psum(c * 3, "x")


f = shard_jit(step)
out_ok = None
try:
  out = np.asarray(f(x))
  error = None
  # Reached only if the call returned: check it (it must not have).
  ins = list(np.asarray(x).reshape(mesh.size, 1000))
  a = testing.rank_order_sum(ins, np.float32)
  b = [testing.rank_order_sum([a] * mesh.size, np.float32) if r == 0 else a * 2
       for r in range(mesh.size)]
  c = testing.rank_order_sum([v + 1 for v in b], np.float32)
  want = testing.rank_order_sum([c * 3] * mesh.size, np.float32)
  out_ok = all(testing.bitwise_equal(o, want) for o in out.reshape(mesh.size, 1000))
except Exception as e:  # noqa: BLE001 - the failure is the expected outcome
  error = {"type": type(e).__name__, "message": str(e)[:300]}
sigs = {str(k): [c.op_name for c in v] for k, v in signature.lowered().items()}
emit({"fast": fast(), "error": error, "out_ok": out_ok, "reports": jax_llar.error_reports(),
      "signatures": sigs})
