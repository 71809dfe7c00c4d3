"""F11: a communicator set given up after a failed registration keeps what
the programs compiled with it use (registry.h: EnsureRegion; NOTES entry 53),
in one process on the mesh of _prelude (2 GPUs: one group). Run with
XLA_FLAGS=--xla_gpu_graph_min_graph_size=1 and a short JAX_LLAR_TIMEOUT_MS.

1. P, a chain of 4 one-shot jax_llar.psums (1000 float32 per rank) with a
   fusion after each, runs 3 times: right sums, on the fast path; XLA
   captures it into a CUDA graph.
2. The test hook fails the next registration of the set once it is complete
   (fail_next_registration_for_testing, registry/seams.h:
   FailNextRegistrationForTesting), and the two-shot's region is asked for
   (CommSet.ensure, as a lowering would): the set is given up. Recorded: the
   error, the regions afterwards (none: withdrawn), the scratch bytes (kept)
   and the decision of a psum lowered afterwards (not run: lax.psum, reason
   'communicator').
3. P again, without a new compilation: XLA replays its graph, so the
   handler (which would now find no argument block) is not called, and the
   kernels address the one-shot region through the peer table they were
   captured with: right sums, no report. (Were the communicators aborted,
   NCCL would have unmapped the address range those tables point into: an
   illegal address.) A handler called again instead ends in "no one_shot_ll
   scratch region": recorded as the error, the test then says so.
4. The epoch counters of the second device moved far ahead on that device
   only (set_epoch_for_testing(..., device=)): its peer waits for lines it
   never sends, as for a peer that is gone. P again ends in the bounded-wait
   error with a report, not in an illegal address. The CUDA context is lost
   after it, so this is the last step.

Prints {"fast_before", "before_ok", "given_up", "regions_before",
"regions_after", "scratch_before", "scratch_after", "two_shot_bytes" (the
failed region's, which scratch_after counts), "fallback" ({"fast",
"reason", "detail"}), "replay" ({"ok", "error"}), "gone" ({"error",
"reports"})}.
"""

import jax
import numpy as np

import jax_llar
from jax_llar import _ext, comm
from jax_llar.algorithms import Algorithm
from jax_llar.tools import _native

from _prelude import emit, fast, mesh, shard_jit, sharding, x

STEPS = 4


def chain(v):
  for _ in range(STEPS):
    v = jax_llar.psum(v, "x") * 0.5
  return v


p = shard_jit(chain)
inputs = np.asarray(x).reshape(mesh.size, -1).astype(np.float64)
want = inputs.sum(axis=0) * 0.5
for _ in range(STEPS - 1):
  want = want * mesh.size * 0.5  # every rank holds the same values after the first step
want = want.astype(np.float32)  # exact: sums of small integers times powers of two


def run(fn):
  """(all ranks right, error or None) of one run of `fn` on x."""
  try:
    out = np.asarray(fn(x)).reshape(mesh.size, -1)
    return bool(all(np.array_equal(out[r], want) for r in range(mesh.size))), None
  except Exception as e:  # noqa: BLE001 - an error is a recorded outcome
    return None, {"type": type(e).__name__, "message": str(e)[:400]}


before = [run(p) for _ in range(3)]
fast_before = fast()
cs = comm.comm_sets()[0]
tools = _native.require("the registration test hook")
regions_before = [a.short_name for a in cs.regions]
scratch_before = cs.scratch_bytes

# 2. The registration fails after it completed: the set is given up.
tools.fail_next_registration_for_testing(cs.comm_id)
try:
  cs.ensure(Algorithm.TWO_SHOT_LL)
  given_up = None
except comm.CommError as e:
  given_up = str(e)
n_logged = len(jax_llar.dispatch_log())
half = jax.ShapeDtypeStruct((mesh.size * 500,), np.float32, sharding=sharding)
shard_jit(lambda v: jax_llar.psum(v, "x") * 2.0).lower(half)  # lowered only: no run
new = jax_llar.dispatch_log()[n_logged:]
fallback = ({"fast": new[-1].fast, "reason": new[-1].reason, "detail": new[-1].detail}
            if new else None)

# 3. The program compiled before: its graph replayed.
replay_ok, replay_error = run(p)
reports_after_replay = jax_llar.error_reports()

# 4. A peer that sends nothing of the epochs its peers wait for.
tools.set_epoch_for_testing(cs.comm_id, (1 << 20) + 30000, device=cs.groups[0][1])
gone_ok, gone_error = run(p)
emit({"fast_before": fast_before, "before_ok": [ok for ok, _ in before],
      "before_errors": [err for _, err in before], "given_up": given_up,
      "regions_before": regions_before, "regions_after": [a.short_name for a in cs.regions],
      "scratch_before": scratch_before, "scratch_after": cs.scratch_bytes,
      "two_shot_bytes": int(_ext.load().region_bytes(int(Algorithm.TWO_SHOT_LL),
                                                     cs.world_size)),
      "fallback": fallback,
      "replay": {"ok": replay_ok, "error": replay_error, "reports": reports_after_replay},
      "gone": {"ok": gone_ok, "error": gone_error, "reports": jax_llar.error_reports()},
      "devices": len(jax.devices())})
