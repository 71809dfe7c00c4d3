"""The fused all-reduce + residual add + RMSNorm kernel through its FFI target
(jax_llar_all_reduce_add_rms_norm), called with jax.ffi.ffi_call inside a
jitted shard_map, against jax_llar.fused.reference run by XLA (its psum on
jax_llar's one-shot path): new_residual bitwise, normed within
fused_helpers.NORMED_MAX_ULP units in the last place, and every rank's
outputs bitwise identical."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_llar
from jax_llar import _ext, algorithms, comm, fused, testing

import fused_helpers as fh

EPS = 1e-6


def _comm_set(mesh) -> comm.CommSet:
  """The mesh's communicator set with the one-shot's region, which the fused
  kernel shares (the lowering allocates it; these direct calls must)."""
  assert _ext.load() is not None, _ext.reason()
  cs = comm.get_or_create([[d.local_hardware_id for d in mesh.devices.flat]])
  cs.ensure(algorithms.Algorithm.ONE_SHOT_LL)
  return cs


# Any signature in range (16 bits): every rank's call site is the same here.
SIGNATURE = 0x2A5


def _fused(cs: comm.CommSet, eps: float = EPS):
  """The FFI call as the lowering emits it (jax_llar.fused._fused_call):
  operands (x, residual, weight), results (normed, new_residual),
  row-major."""
  def call(x, residual, weight):
    out = jax.ShapeDtypeStruct(x.shape, x.dtype)
    normed, new_residual = jax.ffi.ffi_call(fh.TARGET, (out, out))(
        x, residual, weight, comm_id=np.int64(cs.comm_id),
        comm_key=np.int64(cs.key), eps=np.float32(eps), signature=np.int64(SIGNATURE))
    return normed, new_residual
  return call


def _reference(eps: float = EPS):
  return lambda x, r, w: fused.reference(x, r, w, "x", eps)


_JITTED: dict = {}


def _per_rank(mesh, key, fn, x, residual, weight):
  """Runs fn(x[rank], residual, weight) on every rank; returns each output
  stacked over the ranks."""
  if key not in _JITTED:
    _JITTED[key] = jax.jit(jax.shard_map(
        lambda x, r, w: tuple(o[None] for o in fn(x[0], r, w)), mesh=mesh,
        in_specs=(P("x"), P(), P()), out_specs=(P("x"), P("x")), check_vma=False))
  xs = jax.device_put(x, NamedSharding(mesh, P("x")))
  return [np.asarray(o) for o in _JITTED[key](xs, residual, weight)]


def _check_ranks(got, want, dtype, what):
  normed, new_residual = got
  want_normed, want_new_residual = want
  for r in range(normed.shape[0]):
    assert testing.bitwise_equal(normed[r], normed[0]), f"{what}: rank {r} normed differs"
    assert testing.bitwise_equal(new_residual[r], new_residual[0]), (
        f"{what}: rank {r} new_residual differs")
    fh.check(normed[r], new_residual[r], want_normed[r], want_new_residual[r],
             fh.NORMED_MAX_ULP[np.dtype(dtype)], f"{what} rank {r}")


@pytest.mark.parametrize("weight_f32", [False, True], ids=["w_dtype", "w_f32"])
@pytest.mark.parametrize("rows", [1, 2, 8, 32])
@pytest.mark.parametrize("d", [64, 2048, 4096])
@pytest.mark.parametrize("dtype", fh.DTYPES, ids=str)
def test_matches_the_reference(mesh, dtype, d, rows, weight_f32):
  if weight_f32 and dtype == fh.F32:
    pytest.skip("float32 x: the weight is float32 anyway")
  weight_dtype = fh.F32 if weight_f32 else dtype
  if not fh.served((rows, d), dtype, weight_dtype):
    pytest.skip(f"{rows} x {d} {dtype} is not served (grid rule)")
  cs = _comm_set(mesh)
  rng = np.random.default_rng(rows * 10007 + d)
  x, residual, weight = fh.random_case(rng, mesh.size, rows, d, dtype, weight_dtype)
  got = _per_rank(mesh, ("fused", cs.comm_id), _fused(cs), x, residual, weight)
  want = _per_rank(mesh, ("reference",), _reference(), x, residual, weight)
  _check_ranks(got, want, dtype, f"{dtype} {rows}x{d} weight {weight_dtype}")
  # The host emulation agrees too (the loopback harness's check).
  normed, new_residual = fh.emulate(list(x), residual, weight, EPS, dtype)
  fh.check(got[0][0], got[1][0], normed, new_residual,
           fh.NORMED_MAX_ULP_EMULATION[np.dtype(dtype)], "emulation")


@pytest.mark.parametrize("shape", [(4096,), (2, 3, 1024), (1, 1, 64)], ids=str)
def test_leading_dimensions_are_rows(mesh, shape):
  cs = _comm_set(mesh)
  rng = np.random.default_rng(7)
  x = rng.standard_normal((mesh.size,) + shape).astype(np.float32).astype(fh.BF16)
  residual = rng.standard_normal(shape).astype(np.float32).astype(fh.BF16)
  weight = (1 + 0.1 * rng.standard_normal(shape[-1:])).astype(fh.BF16)
  got = _per_rank(mesh, ("fused", cs.comm_id), _fused(cs), x, residual, weight)
  want = _per_rank(mesh, ("reference",), _reference(), x, residual, weight)
  _check_ranks(got, want, fh.BF16, f"shape {shape}")


def test_eps_attribute(mesh):
  cs = _comm_set(mesh)
  rng = np.random.default_rng(11)
  x, residual, weight = fh.random_case(rng, mesh.size, 2, 2048, fh.BF16)
  x = x * np.asarray(1e-3, fh.BF16)  # small values: eps matters
  residual = residual * np.asarray(1e-3, fh.BF16)
  got = _per_rank(mesh, ("fused_eps", cs.comm_id), _fused(cs, 1e-5), x, residual, weight)
  want = _per_rank(mesh, ("reference_eps",), _reference(1e-5), x, residual, weight)
  _check_ranks(got, want, fh.BF16, "eps 1e-5")


def test_interleaved_with_all_reduces_over_replays(mesh):
  """Fused calls of three grids and one-shot all-reduces share the epoch
  counters and the scratch: one program, replayed (CUDA graph)."""
  cs = _comm_set(mesh)
  fused_call = _fused(cs)

  def body(fn_norm, x, r, w):
    outs = []
    for rows in (1, 8, 2):
      xi = x[:rows]
      n, r2 = fn_norm(xi, r[:rows], w)
      y = jax_llar.psum(xi * 2, "x")          # the one-shot all-reduce, another grid
      outs += [n, r2, y]
    return jnp.concatenate([o.astype(jnp.float32).reshape(-1) for o in outs])

  def run(fn_norm):
    f = jax.jit(jax.shard_map(lambda x, r, w: body(fn_norm, x[0], r, w)[None], mesh=mesh,
                              in_specs=(P("x"), P(), P()), out_specs=P("x"),
                              check_vma=False))
    return f

  rng = np.random.default_rng(5)
  x, residual, weight = fh.random_case(rng, mesh.size, 8, 4096, fh.BF16)
  xs = jax.device_put(x, NamedSharding(mesh, P("x")))
  f_fused, f_ref = run(fused_call), run(_reference())
  want = np.asarray(f_ref(xs, residual, weight))
  for _ in range(5):  # first execution, then replays
    got = np.asarray(f_fused(xs, residual, weight))
    for r in range(mesh.size):
      assert testing.bitwise_equal(got[r], got[0]), f"rank {r} differs from rank 0"
    # All outputs went through float32: normed's bf16 ulp is relative 2^-8.
    np.testing.assert_allclose(got[0], want[0], rtol=2 ** -7, atol=0)


def test_unserved_shape_is_an_error(mesh):
  """The handler refuses what the grid rule does not serve, with a message
  (the lowering never emits such a call)."""
  cs = _comm_set(mesh)
  x = np.ones((mesh.size, 32, 4096), np.float32)  # 512 KiB per rank
  with pytest.raises(Exception, match="not served by the fused kernel"):
    _per_rank(mesh, ("fused_unserved", cs.comm_id), _fused(cs), x,
              np.ones((32, 4096), np.float32), np.ones((4096,), np.float32))


@pytest.mark.parametrize("dtype", fh.DTYPES, ids=str)
def test_public_op_takes_the_fused_kernel(mesh, dtype):
  """jax_llar.psum_add_rms_norm lowers to the fused kernel (its decision is
  fast, op "psum_add_rms_norm") and meets the reference's rule."""
  rng = np.random.default_rng(11)
  x, residual, weight = fh.random_case(rng, mesh.size, 2, 2048, dtype, dtype)
  jax_llar.clear_dispatch_log()
  got = _per_rank(mesh, ("public", str(dtype)),
                  lambda x, r, w: jax_llar.psum_add_rms_norm(x, r, w, "x", eps=EPS),
                  x, residual, weight)
  decisions = [d for d in jax_llar.dispatch_log() if d.op == "psum_add_rms_norm"]
  assert decisions and all(d.fast for d in decisions), decisions
  want = _per_rank(mesh, ("reference",), _reference(), x, residual, weight)
  _check_ranks(got, want, dtype, f"public op {dtype}")
