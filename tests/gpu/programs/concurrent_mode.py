"""Issue 12, item 2: XLA's concurrent command-buffer scheduling requested
through jax.jit(..., compiler_options=...), where the lowering cannot see it
(XLA_FLAGS it refuses: jax_llar/lowering.py). A program of 8 independent
jax_llar.psum calls (different sizes, so different signatures) is run 200
times; in this mode XLA may run independent calls at once on one GPU, where
they would share the algorithm's epoch counters and scratch. What must hold:
every output bitwise the reference (then the calls did not overlap, or did
without harm), or the run ends in the foreign-signature error (code 2) or the
bounded wait's timeout (code 1); never a wrong sum without an error.

Prints {"fast", "mode", "steps", "wrong", "error", "codes"}.
"""

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

import jax_llar
from jax_llar import testing

from _prelude import emit, fast, mesh, sharding

SIZES = (64, 96, 200, 333, 1000, 1500, 4096, 7000)


def body(*xs):
  return tuple(jax_llar.psum(x, "x") for x in xs)


fn = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("x"),) * len(SIZES),
                           out_specs=(P("x"),) * len(SIZES), check_vma=False),
             compiler_options={"xla_gpu_command_buffer_scheduling_mode": "CONCURRENT"})
rng = np.random.default_rng(3)
# Three input sets in turn: a call that took a line left over from an earlier
# step (same signature, same program) would show as a wrong sum.
sets = []
for _ in range(3):
  ins = [[testing.random_array(rng, (n,), np.float32) for _ in range(mesh.size)]
         for n in SIZES]
  sets.append(([jax.device_put(np.stack(x), sharding) for x in ins],
               [testing.rank_order_sum(x, np.float32) for x in ins]))
wrong, error, steps = 0, None, 0
try:
  for steps in range(1, 201):
    args, refs = sets[steps % 3]
    outs = [np.asarray(o) for o in fn(*args)]
    wrong += sum(not testing.bitwise_equal(o[r], ref, canonical_nans=True)
                 for o, ref in zip(outs, refs) for r in range(mesh.size))
except Exception as e:  # pylint: disable=broad-except
  error = f"{type(e).__name__}: {e}"[:1500]
emit({"fast": fast(), "mode": "CONCURRENT", "steps": steps, "wrong": wrong,
      "error": error, "codes": sorted({r["code"] for r in jax_llar.error_reports()})})
