"""jax_llar.psum_add_rms_norm on CPU: where no fused kernel serves it, it is its
reference (the unfused code) bitwise, and so are its gradients and batching."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_llar
from jax_llar import dispatch, fused

from cpu_helpers import assert_bitwise, mesh_of

BF16 = np.dtype(ml_dtypes.bfloat16)


def _data(rng, ranks, rows, d, dtype):
  x = rng.standard_normal((ranks, rows, d)).astype(np.float32).astype(dtype)
  r = rng.standard_normal((rows, d)).astype(np.float32).astype(dtype)
  w = (1 + 0.1 * rng.standard_normal((d,))).astype(np.float32).astype(dtype)
  return x, r, w


def _run(fn, mesh, x, r, w, check_vma=True):
  f = jax.jit(jax.shard_map(lambda x, r, w: fn(x[0], r, w), mesh=mesh,
                            in_specs=(P("x"), P(), P()), out_specs=(P(), P()),
                            check_vma=check_vma))
  xs = jax.device_put(x, NamedSharding(mesh, P("x")))
  return [np.asarray(o) for o in f(xs, r, w)]


def _unfused(x, r, w, eps=1e-6):
  """The unfused code a model writes, with lax.psum."""
  nr = lax.psum(x, "x") + r
  h = nr.astype(jnp.float32)
  n = h * lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + eps) * w.astype(jnp.float32)
  return n.astype(x.dtype), nr


@pytest.mark.parametrize("dtype", [np.float32, BF16, np.float16], ids=str)
@pytest.mark.parametrize("ranks,rows,d", [(2, 1, 64), (4, 3, 128), (8, 2, 48)])
@pytest.mark.parametrize("check_vma", [True, False])
def test_equals_the_unfused_code(dtype, ranks, rows, d, check_vma):
  mesh = mesh_of((ranks,), ("x",))
  x, r, w = _data(np.random.default_rng(ranks * rows + d), ranks, rows, d, dtype)
  got = _run(lambda x, r, w: jax_llar.psum_add_rms_norm(x, r, w, "x"), mesh, x, r, w,
             check_vma)
  want = _run(_unfused, mesh, x, r, w, check_vma)
  for g, e in zip(got, want):
    assert g.dtype == np.dtype(dtype)
    assert_bitwise(g, e)
  d_ = jax_llar.dispatch_log()
  assert d_ and all(x.reason == "platform" for x in d_)


def test_grad_equals_the_unfused_grad():
  mesh = mesh_of((2,), ("x",))
  x, r, w = _data(np.random.default_rng(1), 2, 2, 32, np.float32)
  xs = jax.device_put(x, NamedSharding(mesh, P("x")))

  def loss(fn):
    def f(x, r, w):
      n, nr = jax.shard_map(lambda x, r, w: fn(x[0], r, w), mesh=mesh,
                            in_specs=(P("x"), P(), P()), out_specs=(P(), P()))(x, r, w)
      return jnp.sum(n * n) + jnp.sum(jnp.sin(nr))
    return jax.jit(jax.grad(f, argnums=(0, 1, 2)))

  got = loss(lambda x, r, w: jax_llar.psum_add_rms_norm(x, r, w, "x"))(xs, r, w)
  want = loss(_unfused)(xs, r, w)
  for g, e in zip(got, want):
    assert_bitwise(np.asarray(g), np.asarray(e))


def test_vmap_over_a_batch_axis_and_over_the_named_axis():
  mesh = mesh_of((2,), ("x",))
  x, r, w = _data(np.random.default_rng(2), 2, 3, 16, np.float32)
  xb = np.stack([x, 2 * x])  # (batch, ranks, rows, d)
  rb = np.stack([r, r - 1])

  def batched(fn):
    body = jax.vmap(lambda x, r, w: fn(x, r, w), in_axes=(0, 0, None))
    f = jax.jit(jax.shard_map(lambda x, r, w: body(x[:, 0], r, w), mesh=mesh,
                              in_specs=(P(None, "x"), P(), P()), out_specs=(P(), P())))
    return [np.asarray(o) for o in f(xb, rb, w)]

  got = batched(lambda x, r, w: jax_llar.psum_add_rms_norm(x, r, w, "x"))
  want = batched(_unfused)
  for g, e in zip(got, want):
    assert_bitwise(g, e)
  # vmap whose axis is the one the all-reduce names (no mesh at all).
  f_named = jax.vmap(lambda x, r, w: jax_llar.psum_add_rms_norm(x, r, w, "v"),
                     in_axes=(0, None, None), axis_name="v")
  ref_named = jax.vmap(lambda x, r, w: fused.reference(x, r, w, "v", 1e-6),
                       in_axes=(0, None, None), axis_name="v")
  for g, e in zip(f_named(x, r, w), ref_named(x, r, w)):
    assert_bitwise(np.asarray(g), np.asarray(e))


def test_bad_inputs_raise_clear_errors():
  x = jnp.ones((2, 8), jnp.bfloat16)
  with pytest.raises(ValueError, match="one shape and dtype"):
    jax_llar.psum_add_rms_norm(x, jnp.ones((2, 8), jnp.float32), jnp.ones(8), "x")
  with pytest.raises(ValueError, match="weight must have shape"):
    jax_llar.psum_add_rms_norm(x, x, jnp.ones(4), "x")
  with pytest.raises(ValueError, match="float dtypes"):
    jax_llar.psum_add_rms_norm(x.astype(jnp.int32), x.astype(jnp.int32), jnp.ones(8), "x")
  with pytest.raises(NameError, match="unbound axis name: x"):
    jax_llar.psum_add_rms_norm(x, x, jnp.ones(8, jnp.bfloat16), "x")


def test_jaxpr_holds_one_op_with_the_reference_types():
  mesh = mesh_of((2,), ("x",))
  x, r, w = _data(np.random.default_rng(3), 2, 1, 8, BF16)
  f = jax.shard_map(lambda x, r, w: jax_llar.psum_add_rms_norm(x[0], r, w, "x"),
                    mesh=mesh, in_specs=(P("x"), P(), P()), out_specs=(P(), P()))
  text = str(jax.make_jaxpr(f)(jax.device_put(x, NamedSharding(mesh, P("x"))), r, w))
  assert text.count("llar_psum_add_rms_norm") == 1 and "psum_invariant" not in text


def _cuda_text(mesh, x, r, w, debug_info=False):
  f = jax.jit(jax.shard_map(
      lambda x, r, w: jax_llar.psum_add_rms_norm(x[0], r, w, "x", eps=1e-5),
      mesh=mesh, in_specs=(P("x"), P(), P()), out_specs=(P(), P())))
  xs = jax.device_put(x, NamedSharding(mesh, P("x")))
  return f.trace(xs, r, w).lower(lowering_platforms=("cuda",)).as_text(
      debug_info=debug_info)


def test_cuda_lowering_decides_the_fused_op():
  """Lowered for CUDA on CPU devices: one decision for the fused op (the
  policy's candidate, refused by the platform) and, as on CUDA GPUs where
  the fused kernel refuses, one for the reference's psum (which could take
  a fast path of its own there); the served shapes and the refused ones give
  their reasons."""
  mesh = mesh_of((2,), ("x",))
  x, r, w = _data(np.random.default_rng(4), 2, 2, 2048, BF16)
  text = _cuda_text(mesh, x, r, w)
  assert "jax_llar_all_reduce_add_rms_norm" not in text
  fused_d = [d for d in jax_llar.dispatch_log() if d.op == "psum_add_rms_norm"]
  assert [(d.reason, d.candidate, d.impl, d.bytes_per_rank) for d in fused_d] == [
      ("platform", jax_llar.Algorithm.ONE_SHOT_LL, "reference", 2 * 2048 * 2)]
  jax_llar.clear_dispatch_log()
  x, r, w = _data(np.random.default_rng(5), 2, 1, 6, BF16)  # 12-byte rows
  _cuda_text(mesh, x, r, w)
  (d,) = [d for d in jax_llar.dispatch_log() if d.op == "psum_add_rms_norm"]
  assert d.reason == "shape" and "multiple of 8 bytes" in d.detail


def test_cuda_lowering_emits_the_fused_call(monkeypatch):
  mesh = mesh_of((2,), ("x",))
  x, r, w = _data(np.random.default_rng(6), 2, 1, 2048, BF16)
  seen = []

  def fast(axis_ctx, aval, axes, *, platform, op="psum", shape_refusal=None, **kw):
    seen.append((op, aval.shape, shape_refusal))
    del axis_ctx, kw
    return jax_llar.Decision(
        reason="fast_path", detail="", axes=tuple(axes), dtype=str(aval.dtype),
        bytes_per_rank=4096, world_size=2, algorithm=jax_llar.Algorithm.ONE_SHOT_LL,
        candidate=jax_llar.Algorithm.ONE_SHOT_LL, comm_id=4, comm_key=77, op=op)

  monkeypatch.setattr(dispatch, "decide", fast)
  text = _cuda_text(mesh, x, r, w, debug_info=True)
  assert seen == [("psum_add_rms_norm", (1, 2048), None)]
  assert text.count("custom_call @jax_llar_all_reduce_add_rms_norm") == 1
  assert "all_reduce\"" not in text and "custom_call @jax_llar_all_reduce(" not in text
  assert "comm_id = 4 : i64" in text and "comm_key = 77 : i64" in text
  assert re.search(r"eps = 9\.9+\d*E-6 : f32", text), text
  assert "jax_llar.one_shot_ll_add_rms_norm.bf16.4096B.2ranks" in text


def test_grad_differentiates_the_reference_all_reducing_the_primal_once():
  """Under differentiation the op is its reference (issue 23): the grad's
  program is the reference's, equation for equation, with no fused op in
  it; the forward all-reduce runs once (its transpose is a pvary)."""
  mesh = mesh_of((2,), ("x",))
  x, r, w = _data(np.random.default_rng(7), 2, 1, 16, np.float32)
  xs = jax.device_put(x, NamedSharding(mesh, P("x")))

  def loss(op):
    def f(x, r, w):
      n, _ = jax.shard_map(lambda x, r, w: op(x[0], r, w, "x"), mesh=mesh,
                           in_specs=(P("x"), P(), P()), out_specs=(P(), P()))(x, r, w)
      return jnp.sum(n)
    return f

  text = str(jax.make_jaxpr(jax.grad(loss(jax_llar.psum_add_rms_norm),
                                     argnums=(0, 2)))(xs, r, w))
  assert "llar_psum_add_rms_norm" not in text
  assert text.count("psum") == 1 and text.count("pvary") == 1, text
  assert text == str(jax.make_jaxpr(jax.grad(
      loss(lambda *a: fused.reference(*a, 1e-6)), argnums=(0, 2)))(xs, r, w))


def test_explain_finds_the_fused_op_in_a_rolled_loop():
  mesh = mesh_of((2,), ("x",))
  x, r, w = _data(np.random.default_rng(8), 2, 1, 16, np.float32)

  def body(x, r, w):
    def step(c, _):
      n, nr = jax_llar.psum_add_rms_norm(x[0], c, w, "x")
      return nr + n * 0, None
    return lax.scan(step, r, None, length=16)[0]

  f = jax.shard_map(body, mesh=mesh, in_specs=(P("x"), P(), P()), out_specs=P(),
                    check_vma=False)
  found = jax_llar.explain(f, jax.device_put(x, NamedSharding(mesh, P("x"))), r, w)
  assert [x.primitive for x in found] == ["llar_psum_add_rms_norm"]


@pytest.mark.parametrize("mode", ["psum", "swap_psum", "install"])
def test_cpu_records_one_decision_per_fused_op(mode):
  """On CPU the fallback is the reference with lax.psum: the dispatch log
  holds the fused op's decision and nothing for the reference's psum (also
  where the swap would request every psum), and the results stay the
  unfused code's, bitwise."""
  mesh = mesh_of((4,), ("x",))
  x, r, w = _data(np.random.default_rng(9), 4, 2, 64, BF16)

  def two_ops(x, r, w):  # served and shape-refused (6-byte rows) fused ops
    n, nr = jax_llar.psum_add_rms_norm(x, r, w, "x")
    m, mr = jax_llar.psum_add_rms_norm(x[:, :3], nr[:, :3], w[:3], "x")
    return n[:, :3] + m, mr

  def unfused(x, r, w):
    n, nr = _unfused(x, r, w)
    m, mr = _unfused(x[:, :3], nr[:, :3], w[:3])
    return n[:, :3] + m, mr

  want = _run(unfused, mesh, x, r, w)
  jax_llar.clear_dispatch_log()
  try:
    if mode == "install":
      jax_llar.install()
      got = _run(two_ops, mesh, x, r, w)
    elif mode == "swap_psum":
      with jax_llar.swap_psum():
        got = _run(two_ops, mesh, x, r, w)
    else:
      got = _run(two_ops, mesh, x, r, w)
  finally:
    jax_llar.uninstall()
  log = jax_llar.dispatch_log()
  assert [(d.op, d.reason, d.impl, d.bytes_per_rank) for d in log] == [
      ("psum_add_rms_norm", "platform", "reference", 2 * 64 * 2),
      ("psum_add_rms_norm", "shape", "reference", 2 * 3 * 2)], log
  for g, e in zip(got, want):
    assert_bitwise(g, e)


def test_cpu_decisions_say_what_gpus_would_do_for_the_fused_op():
  mesh = mesh_of((2,), ("x",))
  for d, reason in ((64, "platform"), (3, "shape")):
    jax_llar.clear_dispatch_log()
    x, r, w = _data(np.random.default_rng(d), 2, 4, d, BF16)
    _run(lambda x, r, w: jax_llar.psum_add_rms_norm(x, r, w, "x"), mesh, x, r, w)
    (f,) = [e for e in jax_llar.dispatch_log() if e.op == "psum_add_rms_norm"]
    assert f.reason == reason and f.impl == "reference", f
    if reason == "platform":
      assert "fused one_shot_ll + add + RMSNorm kernel" in f.detail
