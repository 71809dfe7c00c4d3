"""The two-shot LL128 atomic all-reduce on real GPUs (over NVLink on the
2 x H200 machine): what is its own. It is not deterministic
(ffi/src/kernels/two_shot_ll128_atomic.cuh), so no tuning table may choose
it (jax_llar.algorithms.NON_DETERMINISTIC): without forcing, no psum of any
size lowers to it.

Forced (JAX_LLAR_ALGORITHM=two_shot_ll128_atomic), its values are
test_algorithms.py's, held to its rule, not bitwise equality: every rank gets
the same bits, int32 is bitwise the reference, every float element is within
jax_llar.testing.atomic_sum_violations's bound of the exact sum, every NaN
the canonical one; at sizes around the 120-byte line, chunk counts not
divisible by the number of ranks, several steps per line slot, up to the
4 MiB limit, special values, many calls in one program (exactly the
reference where every step is exact). Its all-gather rests on 128-byte
stores arriving whole (the store-atomicity test across the GPUs, python -m
jax_llar.tools.store_atomicity --writer_device 0 --reader_device 1, comes
first); its reduce-scatter on .sys-scope atomics and a release fence.
"""

from __future__ import annotations

import numpy as np

import jax_llar
from jax_llar import algorithms, config, testing

from gpu_helpers import allreduce_per_rank, psum_op

ATOMIC = algorithms.Algorithm.TWO_SHOT_LL128_ATOMIC


def test_shipped_tables_never_choose_it(mesh, monkeypatch):
  """Without forcing, no psum of any size lowers to it."""
  monkeypatch.setattr(config.settings, "max_bytes", config.MAX_BYTES_CAP)
  jax_llar.clear_dispatch_log()
  rng = np.random.default_rng(24)
  for n in (1, 1024, 65536, 1 << 20):
    inputs = [testing.random_array(rng, (n,), np.float32) for _ in range(mesh.size)]
    allreduce_per_rank(mesh, inputs, psum_op())
  assert jax_llar.dispatch_log()
  assert all(d.algorithm is not ATOMIC for d in jax_llar.dispatch_log())
