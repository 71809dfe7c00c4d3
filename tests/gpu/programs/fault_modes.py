"""Issue 12, item 5: a fault injected on the group's second device (test
hook of the native tools module, hooks.h) for programs captured afterwards.
argv[1]: corrupt_flag, delay_rank or drop_peer_writes. Run with
JAX_LLAR_TIMEOUT_MS set: each fault must end in a correct result or the
bounded-wait error, never a wrong sum or a hang.

Prints {"fault", "fast_before", "correct" (the faulted call's sums equal the
reference on every rank; None after an error), "seconds" (the faulted call),
"error" (None, or {"type", "message"}), "reports" (jax_llar.error_reports())}.
"""

import sys
import time

import numpy as np

import jax_llar
from jax_llar import comm, testing
from jax_llar.tools import _native

from _prelude import emit, fast, mesh, psum_fn, shard_jit, x

fault = sys.argv[1]
psum_fn(x).block_until_ready()
fast_before = fast()
cs = comm.comm_sets()[0]
_native.require("the fault-injection test hook").set_fault_for_testing(
    cs.comm_id, cs.groups[0][1], fault)
g = shard_jit(lambda v: jax_llar.psum(v, "x") + 1)
inputs = np.asarray(x).reshape(mesh.size, -1)
expect = testing.rank_order_sum(list(inputs), inputs.dtype) + np.float32(1)
t0 = time.monotonic()
try:
  out = np.asarray(g(x)).reshape(mesh.size, -1)
  seconds = time.monotonic() - t0
  correct = all(testing.bitwise_equal(out[r], expect) for r in range(mesh.size))
  error = None
except Exception as e:  # noqa: BLE001 - the bounded-wait error is an expected outcome
  seconds = time.monotonic() - t0
  correct = None
  error = {"type": type(e).__name__, "message": str(e)[:300]}
emit({"fault": fault, "fast_before": fast_before, "correct": correct, "seconds": seconds,
      "error": error, "reports": jax_llar.error_reports()})
