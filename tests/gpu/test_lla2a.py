"""The one-shot all-reduce on NCCL's LL all-to-all session
(nccl_lla2a_one_shot) on real GPUs, forced with settings.algorithm
(JAX_LLAR_ALGORITHM=nccl_lla2a_one_shot): many calls of two sizes in one
program (bitwise the one-shot LL's program), through the kernel bench
(nccl.lla2a_one_shot of the kernel level), and a peer that never calls
failing with the watchdog's report instead of hanging in NCCL's unbounded
receive.

Its values bitwise against the float64 rank-order reference at sizes from
one element to its 256 KiB limit, bitwise the one-shot LL's output (special
values and every NaN pattern of the 16-bit dtypes included) and its region
(NCCL's buffer) reported are test_algorithms.py's.

Needs two GPUs (NCCL device communicators over distinct devices); the
one-GPU loopback harness cannot run it.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

import jax_llar
from jax_llar import algorithms, comm, testing

from gpu_helpers import ALL_DTYPES, allreduce_per_rank, force, run_program, same_bits, took

LLA2A = algorithms.Algorithm.NCCL_LLA2A_ONE_SHOT
LIMIT = algorithms.MAX_BYTES[LLA2A]


def test_lla2a_many_calls_of_two_sizes_in_one_program(mesh, monkeypatch):
  """100 iterations of two psums, 256 KiB (64 blocks) and 4000 bytes (16
  blocks), in one jit: the sessions' epochs and parity over calls of
  different grids, without a barrier; bitwise the one-shot LL's program."""
  dtype = np.dtype(np.float32)
  n, small = 1 << 16, 1000
  inv = np.float32(1.0 / mesh.size)

  def op(v):
    def body(_, acc):
      whole = jax_llar.psum(acc, "x") * inv
      head = jax_llar.psum(acc[:small], "x") * inv
      return whole.at[:small].set(head * np.float32(0.5) + whole[:small] * np.float32(0.5))
    return jax.lax.fori_loop(0, 100, body, v)

  rng = np.random.default_rng(43)
  inputs = [np.round(testing.random_array(rng, (n,), dtype) * 8) / 8
            for _ in range(mesh.size)]
  outs = {}
  for a in (algorithms.Algorithm.ONE_SHOT_LL, LLA2A):
    force(monkeypatch, a)
    outs[a] = allreduce_per_rank(mesh, inputs, lambda v: op(v))
    for r in range(mesh.size):
      assert same_bits(outs[a][r], outs[a][0]), (a, r)
    assert took(a, n * 4) and took(a, small * 4), a
  assert testing.bitwise_equal(outs[LLA2A], outs[algorithms.Algorithm.ONE_SHOT_LL])


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_lla2a_through_the_kernel_bench(dtype):
  """nccl.lla2a_one_shot of the kernel level: 50 captured calls per graph,
  each rank's output bitwise the rank-order reference."""
  from jax_llar.tools import _native  # pylint: disable=g-import-not-at-top
  from jax_llar.tools.bench import kernel_level as kernel_level  # pylint: disable=g-import-not-at-top
  tools = _native.require("the kernel bench")
  devices = jax.devices()
  cs = comm.get_or_create([[d.local_hardware_id for d in devices]])
  spec = kernel_level.KERNEL_IMPLS["nccl.lla2a_one_shot"]
  rng = np.random.default_rng(44)
  for n in (1, 255, 4097, LIMIT // dtype.itemsize):
    inputs = [testing.random_array(rng, (n,), dtype) for _ in devices]
    us, outs = kernel_level.bench(tools, cs.comm_id, spec, inputs, 50, 1)
    assert kernel_level.outputs_correct(spec, outs, inputs, dtype), n
    assert all(t > 0 for rep in us for t in rep), us


def test_lla2a_rank_divergence_fails_with_the_watchdog_report():
  """Only rank 0 calls: NCCL's receive would spin for ever; the watchdog
  warp reports rank 0 waiting for rank 1 and traps, so the call fails."""
  p = run_program("rank_divergence", env={"JAX_LLAR_TIMEOUT_MS": "1500",
                                          "JAX_LLAR_ALGORITHM": LLA2A.short_name})
  assert p.data is not None, p.tail
  assert p.data["error"] is not None, p.tail
  mine = [r for r in p.data["reports"] if r.get("rank") == 0 and r.get("peer") == 1]
  assert mine and all(r["code"] == 1 and r["waited_ns"] >= 1_500_000_000 for r in mine), (
      p.data["reports"])
