"""jax_llar.psum_add_rms_norm under JAX's transformations (issue 23), on CPU,
against its reference (jax_llar.fused.reference, the unfused code) bitwise:
derivatives of every order (jacfwd, jacrev, hessian, grad of grad, third
order) with respect to each of x, residual and weight, also inside jit,
scan, checkpoint and cond, and the derivatives' programs equal to the
reference's; vmap with every combination of batched and unbatched
arguments, an output the batch does not reach unbatched (out_axes=None);
and the error for a traced eps. Before issue 23's fix (a JVP rule of the
op's own, a batching rule that batched every output) the higher
derivatives, jacfwd, hessian, the unbatched vmap outputs and the eps error
failed here; first derivatives such as jacrev were already the reference's."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import jax_llar
from jax_llar import fused

from cpu_helpers import BF16, assert_bitwise, mesh_of

F32 = np.dtype(np.float32)
OPS = {"fused": lambda x, r, w, axis: jax_llar.psum_add_rms_norm(x, r, w, axis),
       "reference": lambda x, r, w, axis: fused.reference(x, r, w, axis)}
ROWS, D = 2, 8


def _data(ranks, dtype, seed):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((ranks, ROWS, D)).astype(np.float32).astype(dtype)
  r = rng.standard_normal((ROWS, D)).astype(np.float32).astype(dtype)
  w = (1 + 0.1 * rng.standard_normal((D,))).astype(np.float32).astype(dtype)
  return x, r, w


def _sharded(op, mesh):
  """(x of every rank, residual, weight) -> (normed, new_residual)."""
  return jax.shard_map(lambda x, r, w: op(x[0], r, w, "x"), mesh=mesh,
                       in_specs=(P("x"), P(), P()), out_specs=(P(), P()))


def _loss(outs):
  """A scalar of both outputs, nonlinear in each (float32, also for bf16)."""
  n, nr = (o.astype(jnp.float32) for o in outs)
  k = jnp.arange(n.size, dtype=jnp.float32).reshape(n.shape) / n.size + 0.5
  return jnp.sum(n * n * k) + jnp.sum(jnp.sin(nr) * (1.5 - k))


def _dot(a, c):
  return jnp.sum(a.astype(jnp.float32) * c)


def _transform(name, f, loss, c1, c2):
  """The derivative `name` of `f` (variable -> (normed, new_residual)) and
  `loss` (variable -> scalar); c1, c2: fixed directions (float32)."""
  if name == "jacfwd":
    return jax.jacfwd(f)
  if name == "jacrev":
    return jax.jacrev(f)
  if name == "hessian":
    return jax.hessian(loss)
  if name == "grad_of_grad":
    return jax.grad(lambda v: _dot(jax.grad(loss)(v), c1))
  if name == "third_order_rev":
    g2 = jax.grad(lambda v: _dot(jax.grad(loss)(v), c1))
    return jax.grad(lambda v: _dot(g2(v), c2))
  if name == "third_order_fwd":  # forward over forward over reverse
    return lambda v: jax.jvp(jax.hessian(loss), (v,), (jnp.asarray(c1, v.dtype),))[1]
  raise AssertionError(name)


TRANSFORMS = ["jacfwd", "jacrev", "hessian", "grad_of_grad", "third_order_rev",
              "third_order_fwd"]


def _derivative(op, transform, wrt, ranks, dtype, seed=0):
  mesh = mesh_of((ranks,), ("x",))
  args = list(_data(ranks, dtype, seed))
  i = "xrw".index(wrt)
  g = _sharded(op, mesh)

  def f(v):
    return g(*args[:i], v, *args[i + 1:])

  rng = np.random.default_rng(seed + 100)
  c1, c2 = (rng.standard_normal(args[i].shape).astype(np.float32) for _ in range(2))
  fn = _transform(transform, f, lambda v: _loss(f(v)), c1, c2)
  return fn, args[i]


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
@pytest.mark.parametrize("wrt", ["x", "r", "w"])
@pytest.mark.parametrize("transform", TRANSFORMS)
def test_derivatives_are_the_references_bitwise(transform, wrt, dtype, ranks):
  got, want = (jax.jit(fn)(v) for fn, v in (
      _derivative(OPS[k], transform, wrt, ranks, dtype) for k in ("fused", "reference")))
  got, want = jax.tree.leaves(got), jax.tree.leaves(want)
  assert len(got) == len(want) > 0
  for g, e in zip(got, want):
    assert np.asarray(g).size and np.isfinite(np.asarray(g, np.float32)).all()
    assert_bitwise(g, e)


def test_issue_23_second_derivative_reproduction():
  """The issue's program: grad of grad with respect to the residual."""
  mesh = mesh_of((2,), ("x",))
  rng = np.random.default_rng(0)
  x, r, w = (rng.standard_normal(s).astype(np.float32) for s in ((2, 3, 8), (3, 8), (8,)))

  def g2(op):
    f = _sharded(op, mesh)
    loss = lambda r: (lambda n, nr: (n**2).sum() + jnp.sin(nr).sum())(*f(x, r, w))
    return np.asarray(jax.jit(jax.grad(lambda r: jax.grad(loss)(r).sum()))(r))

  assert_bitwise(g2(OPS["fused"]), g2(OPS["reference"]))


@pytest.mark.parametrize("wrt", ["x", "r", "w"])
def test_differentiated_programs_are_the_references(wrt):
  """Why the derivatives are bitwise the reference's: under differentiation
  the op is its reference, so each derivative's program is the reference's,
  equation for equation (no fused op left in it), while the program that
  is not differentiated holds the fused op."""
  for transform in TRANSFORMS:
    got, want = (str(jax.make_jaxpr(fn)(v)) for fn, v in (
        _derivative(OPS[k], transform, wrt, 2, BF16) for k in ("fused", "reference")))
    assert "llar_psum_add_rms_norm" not in got and got == want, transform
  x, r, w = _data(2, F32, 0)
  assert "llar_psum_add_rms_norm[" in str(
      jax.make_jaxpr(_sharded(OPS["fused"], mesh_of((2,), ("x",))))(x, r, w))


def test_an_op_without_tangents_stays_fused_under_differentiation():
  """Differentiated with respect to something its inputs do not depend on,
  the op stays the fused op (its outputs are constants of the derivative)."""
  mesh = mesh_of((2,), ("x",))
  x, r, w = _data(2, F32, 1)

  def loss(op):
    f = _sharded(op, mesh)
    return lambda s: _loss(f(x, r, w)) * s

  text = str(jax.make_jaxpr(jax.grad(loss(OPS["fused"])))(2.0))
  assert text.count("llar_psum_add_rms_norm[") == 1
  assert_bitwise(jax.jit(jax.grad(loss(OPS["fused"])))(2.0),
                 jax.jit(jax.grad(loss(OPS["reference"])))(2.0))


def test_the_jvp_rule_is_the_references_jvp():
  """The primitive's registered JVP rule (for a caller that asks for it
  directly): the reference's JVP, bitwise, with symbolic zeros."""
  from jax._src.interpreters import ad  # pylint: disable=g-import-not-at-top
  mesh = mesh_of((2,), ("x",))
  x, r, w = _data(2, F32, 2)
  dx, dr, dw = (np.cos(a) for a in (x, r, w))
  rule = ad.primitive_jvps[fused.psum_add_rms_norm_p]
  for nonzero in itertools.product([False, True], repeat=3):
    if not any(nonzero):
      continue

    def by_rule(x, r, w, dx, dr, dw):
      ts = [t if nz else ad.Zero(jax.typeof(p).to_tangent_aval())
            for p, t, nz in zip((x[0], r, w), (dx[0], dr, dw), nonzero)]
      outs, touts = rule((x[0], r, w), ts, axes=("x",), eps=1e-6)
      return (*outs, *(jnp.zeros_like(o) if type(t) is ad.Zero else t
                       for o, t in zip(outs, touts)))

    def by_jvp(x, r, w, dx, dr, dw):
      ts = [t if nz else jnp.zeros_like(t)
            for t, nz in zip((dx[0], dr, dw), nonzero)]
      # An argument without a tangent is a constant, as in the rule.
      def f(*args):
        it = iter(args)
        return fused.reference(*(next(it) if nz else p for p, nz in
                                 zip((x[0], r, w), nonzero)), "x", 1e-6)
      outs, touts = jax.jvp(f, [p for p, nz in zip((x[0], r, w), nonzero) if nz],
                            [t for t, nz in zip(ts, nonzero) if nz])
      return (*outs, *touts)

    spec = (P("x"), P(), P()) * 2
    got, want = (jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=spec,
                                       out_specs=(P(),) * 4))(x, r, w, dx, dr, dw)
                 for fn in (by_rule, by_jvp))
    for g, e in zip(got, want):
      assert_bitwise(g, e)


@pytest.mark.parametrize("wrapper", ["jit", "scan", "checkpoint", "cond"])
def test_derivatives_inside_jit_scan_checkpoint_and_cond(wrapper):
  """The op inside an inner jit, a scan body, jax.checkpoint and lax.cond:
  first, second and third derivatives are still the reference's, bitwise
  (their rules differentiate the inner program, which binds the op again)."""
  mesh = mesh_of((2,), ("x",))
  x, r, w = _data(2, F32, 3)

  def body(op):
    def step(r, x, w):
      n, nr = op(x, r, w, "x")
      return nr + 0.25 * n

    if wrapper == "jit":
      f = jax.jit(step)
    elif wrapper == "checkpoint":
      f = jax.checkpoint(step)
    elif wrapper == "cond":
      f = lambda r, x, w: jax.lax.cond(jnp.sum(w) > 0, step, lambda r, x, w: r, r, x, w)
    else:
      f = lambda r, x, w: jax.lax.scan(lambda c, _: (step(c, x, w), None), r, None,
                                       length=3)[0]
    g = jax.shard_map(lambda x, r, w: f(r, x[0], w), mesh=mesh,
                      in_specs=(P("x"), P(), P()), out_specs=P())
    return lambda r: jnp.sum(jnp.sin(g(x, r, w)))

  c1 = np.random.default_rng(4).standard_normal(r.shape).astype(np.float32)
  for make in (jax.grad,
               lambda L: jax.grad(lambda v: _dot(jax.grad(L)(v), c1)),
               lambda L: jax.hessian(L)):
    got, want = (jax.jit(make(body(OPS[k])))(r) for k in ("fused", "reference"))
    assert_bitwise(got, want)


def test_jacfwd_and_hessian_shapes():
  """The issue's crash: jacfwd and hessian through the op give the
  reference's shapes (they raised 'got axis spec None but output was
  batched on axis 0')."""
  for wrt, n in (("x", 2 * ROWS * D), ("r", ROWS * D), ("w", D)):
    fn, v = _derivative(OPS["fused"], "hessian", wrt, 2, F32)
    h = jax.jit(fn)(v)
    assert h.shape == v.shape + v.shape and h.size == n * n
    fn, v = _derivative(OPS["fused"], "jacfwd", wrt, 2, F32)
    jn, jr = jax.jit(fn)(v)
    assert jn.shape == jr.shape == (ROWS, D) + v.shape


# --- vmap --------------------------------------------------------------------

B = 3
IN_AXES = list(itertools.product([None, 0], repeat=3))
IN_AXES_IDS = ["".join("-b"[a is not None] for a in ax) for ax in IN_AXES]


def _batched_data(ranks, in_axes, seed):
  """(x of every rank, residual, weight), each with a leading batch axis of
  B where `in_axes` batches it (x: after the rank axis)."""
  x, r, w = _data(ranks, F32, seed)
  scale = (1 + np.arange(B, dtype=np.float32) / 4)
  if in_axes[0] is not None:
    x = np.stack([x * s for s in scale], axis=1)
  if in_axes[1] is not None:
    r = np.stack([r - s for s in scale])
  if in_axes[2] is not None:
    w = np.stack([w * s for s in scale])
  return x, r, w


@pytest.mark.parametrize("in_axes", IN_AXES, ids=IN_AXES_IDS)
def test_vmap_over_a_batch_axis_every_in_axes(in_axes):
  """vmap over a batch axis that the all-reduce does not name, inside a
  shard_map: normed is batched where any argument is, new_residual where x
  or residual is, and an unbatched output is unbatched (out_axes=None)."""
  mesh = mesh_of((2,), ("x",))
  x, r, w = _batched_data(2, in_axes, seed=sum(a is None for a in in_axes))
  bx, br, bw = (a is not None for a in in_axes)
  out_axes = (0 if bx or br or bw else None, 0 if bx or br else None)
  x_spec = P("x", None) if bx else P("x")

  def run(op):
    body = jax.vmap(lambda x, r, w: op(x, r, w, "x"), in_axes=in_axes,
                    out_axes=out_axes, axis_size=B)
    f = jax.jit(jax.shard_map(lambda x, r, w: body(x[0], r, w), mesh=mesh,
                              in_specs=(x_spec, P(), P()), out_specs=(P(), P())))
    return f(x, r, w)

  got, want = run(OPS["fused"]), run(OPS["reference"])
  for g, e, a in zip(got, want, out_axes):
    assert g.shape == ((B,) if a == 0 else ()) + (ROWS, D)
    assert_bitwise(g, e)


@pytest.mark.parametrize("in_axes", IN_AXES, ids=IN_AXES_IDS)
def test_vmap_over_the_named_axis_every_in_axes(in_axes):
  """vmap whose axis is the one the all-reduce names (no mesh): the sum runs
  over the batch; new_residual is batched where residual is, normed where
  residual or weight is; unbatched outputs are unbatched (out_axes=None)."""
  x, r, w = _batched_data(1, in_axes, seed=7)
  x = x[0]  # the batch is the ranks
  bx, br, bw = (a is not None for a in in_axes)
  out_axes = (0 if br or bw else None, 0 if br else None)

  def run(op):
    return jax.jit(jax.vmap(lambda x, r, w: op(x, r, w, "v"), in_axes=in_axes,
                            out_axes=out_axes, axis_name="v", axis_size=B))(x, r, w)

  got, want = run(OPS["fused"]), run(OPS["reference"])
  for g, e in zip(got, want):
    assert_bitwise(g, e)


@pytest.mark.parametrize("in_axes", [a for a in IN_AXES if any(v is not None for v in a)],
                         ids=[i for a, i in zip(IN_AXES, IN_AXES_IDS)
                              if any(v is not None for v in a)])
def test_grad_of_vmap_and_vmap_of_grad(in_axes):
  """Differentiation and batching composed, both ways round, with respect to
  every argument."""
  mesh = mesh_of((2,), ("x",))
  x, r, w = _batched_data(2, in_axes, seed=11)
  x_spec = P("x", None) if in_axes[0] is not None else P("x")

  def run(op):
    def per_example(x, r, w):
      return _loss(op(x, r, w, "x"))

    def batched_loss(x, r, w):
      return jnp.sum(jax.vmap(per_example, in_axes=in_axes)(x, r, w))

    grad_of_vmap = jax.grad(batched_loss, argnums=(0, 1, 2))
    vmap_of_grad = jax.vmap(jax.grad(per_example, argnums=(0, 1, 2)),
                            in_axes=in_axes, out_axes=0)
    f = jax.jit(jax.shard_map(
        lambda x, r, w: (grad_of_vmap(x[0], r, w), vmap_of_grad(x[0], r, w)),
        mesh=mesh, in_specs=(x_spec, P(), P()), out_specs=P(), check_vma=False))
    return jax.tree.leaves(f(x, r, w))

  got, want = run(OPS["fused"]), run(OPS["reference"])
  assert len(got) == len(want) == 6
  for g, e in zip(got, want):
    assert_bitwise(g, e)


# --- eps -----------------------------------------------------------------------


def test_traced_eps_is_a_clear_error():
  x = jnp.ones((2, 8), jnp.float32)
  with pytest.raises(TypeError, match=r"eps must be a static Python float.*traced"):
    jax.jit(lambda e: jax_llar.psum_add_rms_norm(x, x, jnp.ones(8), "x", eps=e))(1e-6)
  mesh = mesh_of((2,), ("x",))
  f = jax.shard_map(
      lambda x, e: jax_llar.psum_add_rms_norm(x[0], x[0], jnp.ones(8), "x", eps=e),
      mesh=mesh, in_specs=(P("x"), P()), out_specs=(P(), P()))
  with pytest.raises(TypeError, match=r"eps must be a static Python float"):
    jax.jit(f)(jnp.ones((2, 2, 8)), jnp.float32(1e-6))
  with pytest.raises(TypeError, match=r"eps must be a static Python float"):
    jax_llar.psum_add_rms_norm(x, x, jnp.ones(8), "x", eps="small")
  # A static eps is taken, a numpy scalar too.
  g = jax.jit(jax.vmap(lambda x: jax_llar.psum_add_rms_norm(x, x, jnp.ones(8), "v",
                                                            eps=np.float32(1e-5)),
                       axis_name="v"))
  assert g(jnp.ones((2, 8)))[0].shape == (2, 8)
