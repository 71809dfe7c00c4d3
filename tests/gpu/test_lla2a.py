"""The one-shot all-reduce on NCCL's LL all-to-all session
(nccl_lla2a_one_shot) on real GPUs, forced with settings.algorithm
(JAX_LLAR_ALGORITHM=nccl_lla2a_one_shot): bitwise against the float64
rank-order reference and bitwise the one-shot LL's output (special values
and every NaN pattern of the 16-bit dtypes included) at sizes from one
element to its 256 KiB limit, many calls of two sizes in one program, through
the kernel bench (nccl.lla2a_one_shot of the kernel level), its region
(NCCL's buffer) reported, and a peer that never calls failing with the
watchdog's report instead of hanging in NCCL's unbounded receive.

Needs two GPUs (NCCL device communicators over distinct devices); the
one-GPU loopback harness cannot run it.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

import jax_llar
from jax_llar import algorithms, comm, config, testing

from gpu_helpers import ALL_DTYPES, DTYPES, allreduce_per_rank, run_program

LLA2A = algorithms.Algorithm.NCCL_LLA2A_ONE_SHOT
LIMIT = algorithms.MAX_BYTES[LLA2A]
UINT = {2: np.uint16, 4: np.uint32}


@pytest.fixture
def lla2a(monkeypatch):
  monkeypatch.setattr(config.settings, "algorithm", LLA2A.short_name)
  monkeypatch.setattr(config.settings, "max_bytes", config.MAX_BYTES_CAP)
  jax_llar.clear_dispatch_log()


def _counts(dtype):
  """Element counts: one element, odd tails, one line either side of a
  block's 64 lines, of the last block of 64 x 64 lines (then the grid's
  64 blocks grow) and of the limit."""
  per_line = 8 // dtype.itemsize
  counts = {1, 3, 7, 1023, 4097}
  for lines in (1, 2, 63, 64, 65, 64 * 64, 64 * 64 + 1, 16384, LIMIT // 8):
    for d in (-1, 0, 1):
      c = lines * per_line + d
      if 0 < c * dtype.itemsize <= LIMIT:
        counts.add(c)
  return sorted(counts)


def _took(algorithm, nbytes):
  return any(d.fast and d.algorithm is algorithm and d.bytes_per_rank == nbytes
             for d in jax_llar.dispatch_log())


def _check(mesh, inputs, dtype, op=None):
  out = allreduce_per_rank(mesh, inputs, op)
  expect = testing.rank_order_sum(inputs, dtype)
  for r in range(len(inputs)):
    assert testing.bitwise_equal(out[r], out[0]), f"rank {r} differs from rank 0"
    assert testing.bitwise_equal(out[r], expect), (
        f"rank {r}: {np.flatnonzero(out[r].astype(np.float64) != expect.astype(np.float64))[:10]}")
  return out


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_lla2a_random_values_all_sizes(mesh, dtype, lla2a):
  rng = np.random.default_rng(41)
  op = lambda v: jax_llar.psum(v, "x")  # a program of its own
  for n in _counts(dtype):
    inputs = [testing.random_array(rng, (n,), dtype) for _ in range(mesh.size)]
    _check(mesh, inputs, dtype, op)
    assert _took(LLA2A, n * dtype.itemsize), f"n={n}: nccl_lla2a_one_shot not taken"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_lla2a_equals_the_one_shot_ll_bit_for_bit(mesh, dtype, monkeypatch):
  """Special values (-0.0, subnormals, inf) and every NaN pattern of the
  16-bit dtypes (a sample of float32's): NCCL's session and the one-shot LL
  give the same bits, NaN bits included."""
  rng = np.random.default_rng(42)
  from jax_llar.tools import loopback_harness as lh  # pylint: disable=g-import-not-at-top
  per_line = 16 // dtype.itemsize  # nan_pattern_lines' 16-byte rows
  lines = lh.nan_pattern_lines(rng, mesh.size, dtype)
  n = min(lines.shape[0] * per_line + 5, LIMIT // dtype.itemsize)
  base = np.stack([testing.random_array(rng, (n,), dtype) for _ in range(mesh.size)])
  inputs = list(lh.special_set(rng, lh.nan_pattern_set(rng, base)))
  monkeypatch.setattr(config.settings, "max_bytes", config.MAX_BYTES_CAP)
  outs = {}
  for a in (algorithms.Algorithm.ONE_SHOT_LL, LLA2A):
    monkeypatch.setattr(config.settings, "algorithm", a.short_name)
    jax_llar.clear_dispatch_log()
    outs[a] = _check(mesh, inputs, dtype, lambda v: jax_llar.psum(v, "x"))
    assert _took(a, n * dtype.itemsize), a
  u = UINT[dtype.itemsize]
  x, y = outs[algorithms.Algorithm.ONE_SHOT_LL].view(u), outs[LLA2A].view(u)
  assert np.array_equal(x, y), np.argwhere(x != y)[:5]


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
  monkeypatch.setattr(config.settings, "max_bytes", config.MAX_BYTES_CAP)
  outs = {}
  for a in (algorithms.Algorithm.ONE_SHOT_LL, LLA2A):
    monkeypatch.setattr(config.settings, "algorithm", a.short_name)
    jax_llar.clear_dispatch_log()
    outs[a] = allreduce_per_rank(mesh, inputs, lambda v: op(v))
    for r in range(mesh.size):
      assert testing.bitwise_equal(outs[a][r], outs[a][0]), (a, r)
    assert _took(a, n * 4) and _took(a, small * 4), a
  assert testing.bitwise_equal(outs[LLA2A], outs[algorithms.Algorithm.ONE_SHOT_LL])


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_lla2a_through_the_kernel_bench(dtype):
  """nccl.lla2a_one_shot of the kernel level: 50 captured calls per graph,
  each rank's output bitwise the rank-order reference."""
  from jax_llar.tools import _native, kernel_level  # pylint: disable=g-import-not-at-top
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


def test_lla2a_region_is_reported(mesh, lla2a):
  dtype = np.dtype(np.float32)
  rng = np.random.default_rng(45)
  _check(mesh, [testing.random_array(rng, (1024,), dtype) for _ in range(mesh.size)], dtype)
  assert _took(LLA2A, 4096)
  held = [s for s in jax_llar.status()["comm_sets"] if LLA2A.short_name in s["regions"]]
  assert held
  for s in held:
    expect = sum(algorithms.region_bytes(algorithms.Algorithm.from_short_name(a),
                                         s["world_size"]) for a in s["regions"])
    assert s["scratch_bytes_per_device"] == expect, s


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
