"""JAX typing and transforms on the fast path (F8), and psums inside control
flow (F7)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_llar
from jax_llar import testing

from gpu_helpers import F32, allreduce_per_rank, fast


def test_f8_typing_grad_vmap_scan(mesh):
  """check_vma typing, out_specs=P(), grad, vmap, scan carry: the same as
  lax.psum's results."""
  rng = np.random.default_rng(6)
  x = jax.device_put(testing.random_array(rng, (mesh.size * 64,), F32),
                     NamedSharding(mesh, P("x")))

  def run(op):
    f = jax.jit(jax.shard_map(lambda v: op(v, "x"), mesh=mesh, in_specs=P("x"),
                              out_specs=P()))
    g = jax.jit(jax.grad(lambda v: jnp.sum(f(v) ** 2)))
    scan = jax.jit(jax.shard_map(
        lambda v: lax.scan(
            lambda c, _: (lax.pcast(op(c, "x") * 0.5, "x", to="varying"), None),
            v, None, length=5)[0],
        mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    vm = jax.jit(jax.vmap(f))
    xb = jnp.stack([x, x * 2])
    return [np.asarray(f(x)), np.asarray(g(x)), np.asarray(scan(x)), np.asarray(vm(xb))]

  jax_llar.clear_dispatch_log()
  mine = run(jax_llar.psum)
  assert fast(jax_llar.dispatch_log())
  ref = run(lax.psum)
  for a, b in zip(mine, ref):  # two ranks: NCCL's sum is the exact rank-order sum
    if mesh.size == 2:
      assert testing.bitwise_equal(a, b)
    else:
      np.testing.assert_allclose(a, b, rtol=1e-6)


def test_f7_inside_control_flow(mesh):
  """psum inside lax.cond (same branch on all ranks) and lax.while_loop."""
  rng = np.random.default_rng(7)
  inputs = [testing.random_array(rng, (300,), F32) for _ in range(mesh.size)]

  def body(v):
    v = lax.cond(jnp.sum(jax_llar.psum(v, "x")) > -1e30,
                 lambda u: jax_llar.psum(u, "x"), lambda u: u * 0, v)
    v = lax.while_loop(lambda c: c[0] < 3,
                       lambda c: (c[0] + 1, jax_llar.psum(c[1], "x") * 0.5), (0, v))[1]
    return v

  out = allreduce_per_rank(mesh, inputs, op=body)
  s = testing.rank_order_sum(inputs, F32)
  for _ in range(3):
    s = testing.rank_order_sum([s] * mesh.size, F32) * np.float32(0.5)
  for r in range(mesh.size):
    assert testing.bitwise_equal(out[r], s)
