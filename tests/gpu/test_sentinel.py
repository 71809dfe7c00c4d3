"""The one-shot sentinel all-reduce on real GPUs, forced with
settings.algorithm (JAX_LLAR_ALGORITHM=one_shot_sentinel): int32 refused
(lax.psum serves it), with the reason.

Its values bitwise against the float64 rank-order reference at sizes up to
its 512 KiB limit, bitwise the one-shot LL's on special values and every NaN
pattern (NaN bits too, every NaN the canonical one), many calls in one
program and its region reported are test_algorithms.py's. The tuning table
does not dispatch to the sentinel yet (it waits for measurements on 2 GPUs):
every test forces it and raises max_bytes to the cap.
"""

from __future__ import annotations

import numpy as np

import jax_llar
from jax_llar import algorithms, testing

from gpu_helpers import I32, check_rule, force

SENT = algorithms.Algorithm.ONE_SHOT_SENTINEL


def test_sentinel_refuses_int32(mesh, monkeypatch):
  """int32 forced onto the sentinel goes to lax.psum, with the reason."""
  force(monkeypatch, SENT)
  rng = np.random.default_rng(23)
  inputs = [testing.random_array(rng, (1000,), I32) for _ in range(mesh.size)]
  check_rule(mesh, inputs, I32)
  decisions = [d for d in jax_llar.dispatch_log() if d.bytes_per_rank == 4000]
  assert decisions and not any(d.fast for d in decisions)
  assert any(d.reason == "dtype" and "int32" in d.detail for d in decisions)
