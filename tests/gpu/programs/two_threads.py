"""F5: two Python threads dispatch the same jitted psum program, 200 calls
each, on the same devices; every result is checked bitwise.

Prints {"fast", "hung" (a thread still alive after 240 s), "errors" (at
most 3)}.
"""

import threading

import jax
import numpy as np

from jax_llar import testing

from _prelude import emit, fast, mesh, psum_fn, sharding

rng = np.random.default_rng(10)
data = [[testing.random_array(rng, (512,), np.float32) for _ in range(mesh.size)]
        for _ in range(2)]
expect = [testing.rank_order_sum(d, np.float32) for d in data]
xs = [jax.device_put(np.stack(d), sharding) for d in data]
psum_fn(xs[0]).block_until_ready()
errors = []


def worker(i):
  try:
    for _ in range(200):
      out = np.asarray(psum_fn(xs[i]))
      for r in range(mesh.size):
        if not testing.bitwise_equal(out[r], expect[i]):
          errors.append(f"thread {i} rank {r}: wrong result")
          return
  except Exception as e:  # noqa: BLE001 - reported to the test
    errors.append(f"thread {i}: {type(e).__name__}: {e}")


threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
for t in threads:
  t.start()
for t in threads:
  t.join(timeout=240)
emit({"fast": fast(), "hung": any(t.is_alive() for t in threads), "errors": errors[:3]})
