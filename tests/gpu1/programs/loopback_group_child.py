"""Child program of the loopback-group tests (tests/gpu1/test_loopback_group.py):
a fresh process, whose first loopback group therefore has id 1.

    python loopback_group_child.py first DIR    # export a program to DIR, compile with
                                                # the persistent cache in DIR/cache
    python loopback_group_child.py second DIR   # run the exported program, compile again
                                                # with that cache

Each run makes one group of 2 ranks (one-shot LL and two-shot LL), runs the
program (exported or jitted) on seeded random inputs (float32, 4 KiB per
rank) and prints one JSON line: ``{"mode", "group_id", "export_correct",
"cache_correct" (every row bitwise equal to the rank-order sum), "hit"
(JAX's compiler logged a persistent-cache hit while compiling the jitted
program), "records" (error codes per rank)}``. Two processes cover both the
export and the cache: each process costs a CUDA context and JAX's start.
"""

from __future__ import annotations

import json
import logging
import os
import sys

import jax

MODE, DIR = sys.argv[1], sys.argv[2]
jax.config.update("jax_compilation_cache_dir", os.path.join(DIR, "cache"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position
from jax import export  # pylint: disable=g-import-not-at-top,wrong-import-position

from jax_llar import testing  # pylint: disable=g-import-not-at-top,wrong-import-position
from jax_llar.tools.loopback import group as loopback_group  # pylint: disable=g-import-not-at-top,wrong-import-position

messages: list[str] = []
logger = logging.getLogger("jax._src.compiler")
logger.setLevel(logging.DEBUG)
logger.addFilter(lambda r: messages.append(r.getMessage()) or True)

W, N = 2, 1024
rng = np.random.default_rng(7)
x = np.stack([testing.random_array(rng, (N,), np.float32) for _ in range(W)])
want = testing.rank_order_sum(list(x), np.float32)


def program(g):
  # Two calls (one per algorithm) and an exact scaling between them.
  return lambda v: g.psum(g.psum(v) * 0.5, algorithm="two_shot_ll")


def correct(y):
  return all(testing.bitwise_equal(row, want2) for row in np.asarray(y))


want2 = testing.rank_order_sum([want * np.float32(0.5)] * W, np.float32)
out: dict = {"mode": MODE}
path = os.path.join(DIR, "program.bin")
with loopback_group.LoopbackGroup(W) as g:
  out["group_id"] = g.id
  # The jitted program first, so that no other compile of this process can
  # have filled the cache entry it looks up.
  out["cache_correct"] = correct(jax.jit(program(g))(x))
  out["hit"] = any("cache hit" in m.lower() for m in messages)
  if MODE == "first":
    exp = export.export(jax.jit(program(g)), disabled_checks=[
        export.DisabledSafetyCheck.custom_call(loopback_group.TARGET_ALL_REDUCE)])(
            jax.ShapeDtypeStruct(x.shape, x.dtype))
    with open(path, "wb") as f:
      f.write(exp.serialize())
  elif MODE == "second":
    with open(path, "rb") as f:
      exp = export.deserialize(bytearray(f.read()))
  else:
    raise SystemExit(f"unknown mode {MODE}")
  out["export_correct"] = correct(exp.call(x))
  out["records"] = [r["code"] for r in g.records()]
print(json.dumps(out), flush=True)
