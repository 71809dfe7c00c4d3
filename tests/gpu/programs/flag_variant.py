"""F7: jax_llar.psum(x) * 0.5 under the XLA_FLAGS this process was started
with, at 1, 333, 4096 and 65536 elements per rank, checked bitwise.

Prints {"fast", "ok", "xla_flags"}.
"""

import os

import jax
import numpy as np

import jax_llar
from jax_llar import testing

from _prelude import emit, fast, mesh, shard_jit, sharding

f = shard_jit(lambda v: jax_llar.psum(v, "x") * 0.5)
rng = np.random.default_rng(0)
ok = True
for n in (1, 333, 4096, 65536):
  ins = [testing.random_array(rng, (n,), np.float32) for _ in range(mesh.size)]
  out = np.asarray(f(jax.device_put(np.stack(ins), sharding)))
  ref = testing.rank_order_sum(ins, np.float32) * np.float32(0.5)
  ok &= all(testing.bitwise_equal(out[r], ref) for r in range(mesh.size))
emit({"fast": fast(), "ok": bool(ok), "xla_flags": os.environ.get("XLA_FLAGS", "")})
