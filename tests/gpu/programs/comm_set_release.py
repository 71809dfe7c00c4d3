"""F11: a communicator set that nothing used is released with its device
memory (native ``destroy_comm_set``, registry.h: DestroyCommSet), in one
process on the first two GPUs.

Sets are made with the native ``create_comm_set`` itself (jax_llar.comm
keeps one set per group layout), and device memory is the driver's count on
every device (memory_baseline.used_mib):

1. a warm-up set, made and destroyed (NCCL's one-time state stays);
2. the baseline;
3. CYCLES sets, each made (measured) and destroyed (measured);
4. CYCLES sets made and kept (what a refused set cost before the release;
   measured after each);
5. the rules: a set holding the one-shot's region refuses ("holds the
   one_shot_ll scratch region") and keeps working; a destroyed id answers
   comm_key 0, no regions, 0 scratch bytes, ensure_region "... was
   destroyed", and a second destroy does nothing; the next set gets a new
   id;
6. a jax_llar.psum over all devices after the aborts, checked against its
   sum.

Prints {"baseline_mib", "cycles": [{"id", "made_mib", "destroyed_mib"}],
"kept_mib", "refusal", "region_set", "destroyed", "next_id", "psum_ok",
"fast"}.
"""

from __future__ import annotations

import os

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # as jax_llar.comm: no NVLink SHARP

import _prelude  # noqa: E402
import numpy as np  # noqa: E402
from memory_baseline import used_mib  # noqa: E402

from jax_llar import _ext  # noqa: E402

CYCLES = 4
TIMEOUT_NS = 5_000_000_000


def main() -> None:
  mod = _ext.load()
  assert mod is not None, _ext.reason()
  groups = [[0, 1]]
  mod.destroy_comm_set(mod.create_comm_set(groups, TIMEOUT_NS))  # warm-up
  baseline = used_mib()
  cycles = []
  for _ in range(CYCLES):
    cid = mod.create_comm_set(groups, TIMEOUT_NS)
    made = used_mib()
    mod.destroy_comm_set(cid)
    cycles.append({"id": cid, "made_mib": made, "destroyed_mib": used_mib()})
  kept = []
  for _ in range(CYCLES):
    mod.create_comm_set(groups, TIMEOUT_NS)
    kept.append(used_mib())

  one_shot = mod.ALGORITHMS["one_shot_ll"]
  held = mod.create_comm_set(groups, TIMEOUT_NS)
  mod.ensure_region(held, one_shot)
  try:
    mod.destroy_comm_set(held)
    refusal = None
  except RuntimeError as e:
    refusal = str(e)
  region_set = {"comm_key": mod.comm_key(held) != 0,
                "regions": list(mod.regions(held)),
                "scratch_bytes": mod.scratch_bytes(held)}

  gone = cycles[0]["id"]
  try:
    mod.ensure_region(gone, one_shot)
    ensure = None
  except RuntimeError as e:
    ensure = str(e)
  second = mod.destroy_comm_set(gone)  # a no-op
  destroyed = {"comm_key": mod.comm_key(gone), "regions": list(mod.regions(gone)),
               "scratch_bytes": mod.scratch_bytes(gone), "ensure_region": ensure,
               "second_destroy": second, "error_reports": len(mod.error_reports())}
  next_id = mod.create_comm_set(groups, TIMEOUT_NS)

  n = _prelude.mesh.size
  out = np.asarray(_prelude.psum_fn(_prelude.x)).reshape(n, 1000)
  want = np.arange(n * 1000, dtype=np.float64).reshape(n, 1000).sum(axis=0)
  psum_ok = bool(all(np.array_equal(out[r], want.astype(np.float32)) for r in range(n)))

  _prelude.emit({"baseline_mib": baseline, "cycles": cycles, "kept_mib": kept,
                 "refusal": refusal, "region_set": region_set, "held_id": held,
                 "destroyed": destroyed, "next_id": next_id, "psum_ok": psum_ok,
                 "fast": _prelude.fast(), "nccl": mod.nccl_runtime_version()})


if __name__ == "__main__":
  main()
