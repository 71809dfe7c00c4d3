"""F12: only rank 0 calls the psum (lax.cond on axis_index): the call must
fail with a timeout report, not hang. Run with a short JAX_LLAR_TIMEOUT_MS.

Prints {"error" (None, or {"type", "message"}), "reports"
(jax_llar.error_reports())}.
"""

from jax import lax

import jax_llar

from _prelude import emit, shard_jit, x

f = shard_jit(lambda v: lax.cond(lax.axis_index("x") == 0,
                                 lambda u: jax_llar.psum(u, "x"), lambda u: u * 2, v))
try:
  f(x).block_until_ready()
  error = None
except Exception as e:  # noqa: BLE001 - the failure is the expected outcome
  error = {"type": type(e).__name__, "message": str(e)[:300]}
emit({"error": error, "reports": jax_llar.error_reports()})
