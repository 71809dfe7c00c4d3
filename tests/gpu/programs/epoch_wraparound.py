"""F4: epoch counters seeded just below 2^16, 2^30, 2^31 and 2^32 (test hook
of the native tools module); crossing each re-zeroes scratch halves (every
2^14 epochs, epoch.cuh) and wraps the LL flags' 16 epoch bits (ll.cuh; 2^32
also the LL128 flags' 32). Eight random sizes after each seed, checked
bitwise, every call carrying its signature.

Prints {"fast", "ok" (every check passed), "checks"}.
"""

import jax
import numpy as np

from jax_llar import comm, testing
from jax_llar.tools import _native

from _prelude import emit, fast, mesh, psum_fn, sharding

rng = np.random.default_rng(11)
checks = 0


def check(n):
  global checks
  checks += 1
  ins = [testing.random_array(rng, (n,), np.float32) for _ in range(mesh.size)]
  out = np.asarray(psum_fn(jax.device_put(np.stack(ins), sharding)))
  ref = testing.rank_order_sum(ins, np.float32)
  return all(testing.bitwise_equal(out[r], ref) for r in range(mesh.size))


ok = check(4096)
tools = _native.require("the epoch test hook")
for seed in (2 ** 16 - 3, 2 ** 30 - 3, 2 ** 31 - 3, 2 ** 32 - 3):
  for cs in comm.comm_sets():
    tools.set_epoch_for_testing(cs.comm_id, seed)
  for _ in range(8):
    ok &= check(1 + int(rng.integers(1, 60000)))
emit({"fast": fast(), "ok": bool(ok), "checks": checks})
