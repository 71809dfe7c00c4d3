"""F13: the peer writes of the group's second device are dropped (test hook
of the native tools module) for programs captured afterwards: the call must
fail with a report of rank, peer and epoch. Run with a short
JAX_LLAR_TIMEOUT_MS.

Prints {"fast_before" (the first program took the fast path), "error"
(None, or {"type", "message"}), "reports" (jax_llar.error_reports())}.
"""

import jax_llar
from jax_llar import comm
from jax_llar.tools import _native

from _prelude import emit, fast, psum_fn, shard_jit, x

psum_fn(x).block_until_ready()
fast_before = fast()
cs = comm.comm_sets()[0]
_native.require("the dropped-write test hook").set_drop_peer_writes_for_testing(
    cs.comm_id, cs.groups[0][1], True)
g = shard_jit(lambda v: jax_llar.psum(v, "x") + 1)
try:
  g(x).block_until_ready()
  error = None
except Exception as e:  # noqa: BLE001 - the failure is the expected outcome
  error = {"type": type(e).__name__, "message": str(e)[:300]}
emit({"fast_before": fast_before, "error": error, "reports": jax_llar.error_reports()})
