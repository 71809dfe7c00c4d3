"""Compiles a swapped psum program with the persistent compilation cache in
argv[1] and runs it; prints whether the cache was hit, the decisions and
whether the result equals the rank-order sum (bitwise)."""

from __future__ import annotations

import logging
import sys

import jax

jax.config.update("jax_compilation_cache_dir", sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position
from jax import lax  # pylint: disable=g-import-not-at-top,wrong-import-position

import jax_llar  # pylint: disable=g-import-not-at-top,wrong-import-position
from jax_llar import testing  # pylint: disable=g-import-not-at-top,wrong-import-position

from _prelude import emit, mesh, shard_jit, sharding  # pylint: disable=g-import-not-at-top,wrong-import-position

messages: list[str] = []
logger = logging.getLogger("jax._src.compiler")
logger.setLevel(logging.DEBUG)
logger.addFilter(lambda r: messages.append(r.getMessage()) or True)

rng = np.random.default_rng(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
inputs = [testing.random_array(rng, (256,), np.float32) for _ in range(mesh.size)]
x = jax.device_put(np.concatenate(inputs), sharding)
with jax_llar.swap_psum():
  out = np.asarray(shard_jit(lambda v: lax.psum(v, "x"))(x)).reshape(mesh.size, -1)
want = testing.rank_order_sum(inputs, np.float32)
emit({"hit": any("cache hit" in m.lower() for m in messages),
      "fast": [d.fast for d in jax_llar.dispatch_log()],
      "correct": all(testing.bitwise_equal(o, want) for o in out)})
