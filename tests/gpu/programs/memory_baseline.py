"""F11: compiling, running and dropping many executables of many shapes
(two algorithms, psums and the fused op), with jax.clear_caches() between
rounds, brings device memory back to its baseline; jax_llar's scratch stays
what status() reports and does not grow with programs.

Device memory is the driver's count (cuMemGetInfo on the primary context of
every device) under XLA_PYTHON_CLIENT_ALLOCATOR=platform (set by the test),
so that XLA returns freed buffers to the driver instead of pooling them.
Prints {"fast", "baseline_mib", "rounds_mib", "scratch", "comm_sets"}.
"""

from __future__ import annotations

import ctypes
import gc

import _prelude
import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_llar
from jax_llar import config

_cuda = ctypes.CDLL("libcuda.so.1")


def used_mib() -> list[float]:
  """Per device: total - free, MiB (cuMemGetInfo_v2 in its primary context)."""
  out = []
  for d in jax.devices():
    dev, ctx, prev = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p()
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    assert _cuda.cuDeviceGet(ctypes.byref(dev), d.local_hardware_id) == 0
    assert _cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    assert _cuda.cuCtxPushCurrent_v2(ctx) == 0
    assert _cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)) == 0
    assert _cuda.cuCtxPopCurrent_v2(ctypes.byref(prev)) == 0
    assert _cuda.cuDevicePrimaryCtxRelease_v2(dev) == 0
    out.append((total.value - free.value) / 2**20)
  return out


def one_round(seed: int) -> None:
  """30 programs of different shapes, run once each and dropped."""
  mesh = _prelude.mesh
  sharding = NamedSharding(mesh, P("x"))
  rng = np.random.default_rng(seed)
  for i in range(30):
    n = int(rng.integers(1, 60_000))
    x = jax.device_put(rng.standard_normal((mesh.size, n)).astype(np.float32), sharding)
    algorithm = ("one_shot_ll", "two_shot_ll")[i % 2]
    old = config.settings.algorithm
    config.settings.algorithm = algorithm
    try:
      fn = _prelude.shard_jit(lambda v: jax_llar.psum(v, "x") * 2)
      fn(x).block_until_ready()
    finally:
      config.settings.algorithm = old
    if i % 5 == 0:  # the fused op too
      d = 1024
      r = jax.device_put(np.ones((mesh.size, d), np.float32), sharding)
      w = jax.device_put(np.ones((d,), np.float32), NamedSharding(mesh, P()))
      f = jax.jit(jax.shard_map(
          lambda a, b, c: jax_llar.psum_add_rms_norm(a, b, c, "x")[0], mesh=mesh,
          in_specs=(P("x"), P("x"), P()), out_specs=P("x"), check_vma=False))
      f(r, r, w).block_until_ready()
    del fn, x
  jax.clear_caches()
  gc.collect()


def main() -> None:
  one_round(0)  # warm-up: communicators, regions, XLA's own one-time state
  baseline = used_mib()
  scratch = [(c["comm_id"], c["regions"], c["scratch_bytes_per_device"])
             for c in jax_llar.status()["comm_sets"]]
  rounds = []
  for seed in (1, 2, 3):
    one_round(seed)
    rounds.append(used_mib())
  after = [(c["comm_id"], c["regions"], c["scratch_bytes_per_device"])
           for c in jax_llar.status()["comm_sets"]]
  _prelude.emit({"fast": _prelude.fast(), "baseline_mib": baseline, "rounds_mib": rounds,
                 "scratch": scratch, "scratch_after": after,
                 "comm_sets": len(jax_llar.status()["comm_sets"])})


if __name__ == "__main__":
  main()
