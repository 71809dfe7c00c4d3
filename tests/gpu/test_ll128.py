"""The one-shot LL128 all-reduce on real GPUs (over NVLink on the 2 x H200
machine), forced with settings.algorithm (JAX_LLAR_ALGORITHM=one_shot_ll128):
bitwise the one-shot LL's output at sizes around the 120-byte line that both
serve, special values included.

Its values against the float64 rank-order reference at sizes around the
120-byte line, odd sizes, up to the LL128's limit, and many calls in one
program are test_algorithms.py's. The tuning table does not dispatch to the
LL128 (it waits for measurements on 2 GPUs, and for the store-atomicity test
over NVLink: python -m jax_llar.tools.store_atomicity --writer_device 0
--reader_device 1): every test forces it and raises max_bytes to the cap.
"""

from __future__ import annotations

import numpy as np

from jax_llar import algorithms, testing

from gpu_helpers import F32, allreduce_per_rank, check_rule, force, psum_op, took

LL128 = algorithms.Algorithm.ONE_SHOT_LL128
LL = algorithms.Algorithm.ONE_SHOT_LL
LL_LIMIT = algorithms.MAX_BYTES[LL]


def test_ll128_equals_the_one_shot_ll(mesh, monkeypatch):
  """Same inputs through both algorithms: the same bits (special values
  included; NaNs by position), at sizes both serve: one element either side
  of the 120-byte line, odd, the one-shot LL's limit."""
  dtype = F32
  rng = np.random.default_rng(22)
  specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 3.4e38],
                      dtype=dtype)
  for n in (30, 31, 29, 4097, LL_LIMIT // 4):
    inputs = []
    for _ in range(mesh.size):
      x = testing.random_array(rng, (n,), dtype)
      x[rng.integers(0, n, min(n, 16))] = rng.choice(specials, min(n, 16))
      inputs.append(x)
    force(monkeypatch, LL128)
    got = check_rule(mesh, inputs, dtype)
    assert took(LL128, n * 4)
    force(monkeypatch, LL)
    ll = allreduce_per_rank(mesh, inputs, psum_op())
    # NaNs by position: a sum of NaN payloads keeps the payload of the
    # operand each compiled addition puts first (benchmarks/NOTES.md).
    assert testing.bitwise_equal(got, ll), f"n={n}"
