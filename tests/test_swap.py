"""Which psums reach jax_llar: ``swap_psum`` regions, ``install()``, the call.

jax_llar lowers JAX's own psum primitives; a psum requested for the fast
path is recorded in the dispatch log with its ``source``, any other psum is
JAX's and unrecorded. On CPU every requested psum records reason
"platform" with candidate ONE_SHOT_LL (what NVLink GPUs would run), so the
log says which psums a GPU would have served. Results are compared with
``lax.psum`` bitwise.

The mark is JAX's XLA metadata: it is in the equation's context, in the
lowered program (a frontend attribute) and in jit's cache keys.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.lax import psum as imported_psum  # imported before any swap
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_llar
from jax_llar import swap
from jax_llar.algorithms import Algorithm

from cpu_helpers import assert_bitwise, mesh_of, random_input, user_env

MARK = 'mhlo.frontend_attributes = {jax_llar = "swap"}'


@pytest.fixture(autouse=True)
def _uninstalled():
  """Every test starts and ends without the process-wide swap."""
  jax_llar.uninstall()
  yield
  jax_llar.uninstall()


def _log():
  return [(d.source, d.reason, d.candidate) for d in jax_llar.dispatch_log()]


def _sharded(mesh, x):
  return jax.device_put(x, NamedSharding(mesh, P("x")))


def _counting_step(mesh, psum_fn=None):
  """A jitted shard_map psum, and the list its body appends to per trace."""
  traces = []

  def body(v):
    traces.append(1)
    return (psum_fn or jax.lax.psum)(v, "x")

  return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"),
                               out_specs=P())), traces


SWAP_DECISION = ("swap", "platform", Algorithm.ONE_SHOT_LL)


def test_context_and_decorator_request_the_fast_path():
  mesh = mesh_of((2,), ("x",))
  x = _sharded(mesh, random_input(np.random.default_rng(0), (2, 8), np.float32))
  f, _ = _counting_step(mesh)
  want = np.asarray(f(x))
  assert _log() == []  # not requested: JAX's, unrecorded
  with jax_llar.swap_psum():
    assert_bitwise(np.asarray(f(x)), want)
  assert _log() == [SWAP_DECISION]

  @jax.jit
  @jax_llar.swap_psum()
  def step(v):
    return jax.shard_map(lambda s: lax.psum(s, "x"), mesh=mesh, in_specs=P("x"),
                         out_specs=P())(v)

  jax_llar.clear_dispatch_log()
  assert_bitwise(np.asarray(step(x)), want)
  assert _log() == [SWAP_DECISION]


@pytest.mark.parametrize("what", ["pmean", "imported_psum", "library_code",
                                  "nested_jit", "scan_body"])
def test_every_psum_in_a_region_is_requested(what):
  mesh = mesh_of((4,), ("x",))
  x = _sharded(mesh, random_input(np.random.default_rng(1), (4, 16), np.float32))
  inner = jax.jit(jax.shard_map(lambda v: lax.psum(v, "x"), mesh=mesh,
                                in_specs=P("x"), out_specs=P()))
  inner(x)  # compiled outside first: the region must trace it again

  def scan_body(v):
    def step(c, _):
      return c + lax.psum(v, "x") * 0.5, None
    return lax.scan(step, jnp.zeros_like(v), None, length=3)[0]

  fns = {
      "pmean": lambda v: lax.pmean(v, "x"),
      "imported_psum": lambda v: imported_psum(v, "x"),
      "library_code": lambda v: jax.nn.logsumexp(lax.psum(v, "x")),
      "scan_body": scan_body,
  }
  if what == "nested_jit":
    run = jax.jit(lambda v: inner(v) * 2)
  else:
    run = jax.jit(jax.shard_map(fns[what], mesh=mesh, in_specs=P("x"),
                                out_specs=P("x") if what == "scan_body" else P()))
  want = np.asarray(run(x))
  assert _log() == []
  with jax_llar.swap_psum():
    got = np.asarray(run(x))
  assert_bitwise(got, want)
  assert _log() == [SWAP_DECISION]


@pytest.mark.parametrize("check_vma", [True, False])
def test_gradient_transpose_psums_are_requested(check_vma):
  """jax.grad of a shard_map body with a replicated weight: JAX adds a psum
  of the weight's cotangent (the transpose of pvary, or of the implicit
  broadcast without check_vma); inside a region it is requested too."""
  mesh = mesh_of((2,), ("x",))
  x = _sharded(mesh, random_input(np.random.default_rng(2), (2, 8), np.float32))
  w = jnp.float32(1.5)

  def loss(w, x):
    y = jax.shard_map(lambda v, w: v * w, mesh=mesh, in_specs=(P("x"), P()),
                      out_specs=P("x"), check_vma=check_vma)(x, w)
    return y.sum()

  g = jax.jit(jax.grad(loss))
  want = np.asarray(g(w, x))
  assert _log() == []
  with jax_llar.swap_psum():
    got = np.asarray(g(w, x))
  assert_bitwise(got, want)
  assert _log() == [SWAP_DECISION]
  # The region inside the function being differentiated marks the transpose.
  jax_llar.clear_dispatch_log()

  def loss_marked(w, x):
    with jax_llar.swap_psum():
      return loss(w, x)

  assert_bitwise(np.asarray(jax.jit(jax.grad(loss_marked))(w, x)), want)
  assert _log() == [SWAP_DECISION]


def test_explicit_psum_transpose_is_marked():
  """Without check_vma the transpose of psum is a psum: jax_llar.psum's is
  requested too (source "psum")."""
  mesh = mesh_of((2,), ("x",))
  x = _sharded(mesh, random_input(np.random.default_rng(3), (2, 8), np.float32))

  def loss(fn, x):
    y = jax.shard_map(lambda v: fn(v * v, "x"), mesh=mesh, in_specs=P("x"),
                      out_specs=P("x"), check_vma=False)(x)
    return y.sum()

  want = jax.jit(jax.value_and_grad(lambda x: loss(lax.psum, x)))(x)
  assert _log() == []
  got = jax.jit(jax.value_and_grad(lambda x: loss(jax_llar.psum, x)))(x)
  for a, b in zip(got, want):
    assert_bitwise(np.asarray(a), np.asarray(b))
  # The forward psum and its transpose (a psum of the cotangent).
  assert [d.source for d in jax_llar.dispatch_log()] == ["psum", "psum"]


def test_mark_is_in_the_lowered_program_and_the_cache_key():
  mesh = mesh_of((2,), ("x",))
  x = _sharded(mesh, random_input(np.random.default_rng(4), (2, 8), np.float32))
  f, _ = _counting_step(mesh)
  outside = f.lower(x).as_text()
  with jax_llar.swap_psum():
    inside = f.lower(x).as_text()
  assert MARK in inside and MARK not in outside
  f, traces = _counting_step(mesh)
  f(x)
  n = len(traces)
  with jax_llar.swap_psum():
    f(x)
    f(x)
  assert len(traces) == n + 1  # traced again once inside, then cached
  f(x)
  assert len(traces) == n + 1  # outside: the first trace's executable
  assert _log() == [SWAP_DECISION] * 2  # the lower() inside, and the call


def test_swap_is_per_thread():
  mesh = mesh_of((2,), ("x",))
  x = _sharded(mesh, random_input(np.random.default_rng(5), (2, 8), np.float32))
  f, _ = _counting_step(mesh)
  entered, done = threading.Event(), threading.Event()
  other = {}

  def worker():
    entered.wait()
    other["text"] = f.lower(x).as_text()
    done.set()

  t = threading.Thread(target=worker)
  t.start()
  with jax_llar.swap_psum():
    entered.set()
    done.wait()
    mine = f.lower(x).as_text()
  t.join()
  assert MARK in mine and MARK not in other["text"]


def test_same_instance_reentered_and_shared_by_threads():
  mesh = mesh_of((2,), ("x",))
  x = _sharded(mesh, random_input(np.random.default_rng(6), (2, 8), np.float32))
  f, _ = _counting_step(mesh)
  s = jax_llar.swap_psum()
  with s:
    with s:
      assert MARK in f.lower(x).as_text()
    assert MARK in f.lower(x).as_text()
  assert MARK not in f.lower(x).as_text()
  barrier = threading.Barrier(2)
  texts = []

  def worker():
    with s:
      barrier.wait()
      texts.append(f.lower(x).as_text())
      barrier.wait()

  threads = [threading.Thread(target=worker) for _ in range(2)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert len(texts) == 2 and all(MARK in t for t in texts)
  assert MARK not in f.lower(x).as_text()


def test_install_swaps_every_psum_and_changes_the_cache_key():
  mesh = mesh_of((2,), ("x",))
  x = _sharded(mesh, random_input(np.random.default_rng(7), (2, 8), np.float32))
  f, traces = _counting_step(mesh)
  want = np.asarray(f(x))
  assert _log() == [] and not jax_llar.installed()
  jax_llar.install()
  assert jax_llar.installed() and jax_llar.status()["swap"]["installed"]
  assert_bitwise(np.asarray(f(x)), want)
  assert len(traces) == 2  # compiled before install(): traced again
  assert _log() == [("install", "platform", Algorithm.ONE_SHOT_LL)]
  jax_llar.uninstall()
  jax_llar.clear_dispatch_log()
  f(x)
  assert len(traces) == 2 and _log() == []  # the executable from before


def test_region_off_keeps_jax_psums_under_install():
  mesh = mesh_of((2,), ("x",))
  x = _sharded(mesh, random_input(np.random.default_rng(8), (2, 8), np.float32))
  jax_llar.install()

  @jax.jit
  def step(v):
    def body(s):
      with jax_llar.swap_psum(False):
        a = lax.psum(s, "x")            # stays JAX's
        b = jax_llar.psum(s * 2, "x")   # the explicit call still asks
      return a + b + lax.psum(s * 3, "x")  # installed
    return jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P())(v)

  step(x)
  assert sorted(d.source for d in jax_llar.dispatch_log()) == ["install", "psum"]


@pytest.mark.parametrize("what", ["constant", "bool", "int16", "axis_index_groups"])
def test_psums_the_policy_refuses_inside_a_region(what):
  """Inside a region, psums the fast path does not serve are JAX's, with the
  reason recorded (constants never reach a lowering). A bool psum is an int32
  psum (lax.psum converts), which the fast path serves."""
  mesh = mesh_of((4,), ("x",))
  rng = np.random.default_rng(9)
  x = _sharded(mesh, random_input(rng, (4, 8), np.float32))
  fns = {
      "constant": lambda v: v + lax.psum(3.0, "x"),
      "bool": lambda v: lax.psum(v > 0, "x").astype(v.dtype),
      "int16": lambda v: lax.psum(v.astype(np.int16), "x").astype(v.dtype),
      "axis_index_groups": lambda v: lax.psum(v, "x",
                                              axis_index_groups=[[0, 1], [2, 3]]),
  }
  run = jax.jit(jax.shard_map(fns[what], mesh=mesh, in_specs=P("x"),
                              out_specs=P("x"), check_vma=False))
  want = np.asarray(run(x))
  with jax_llar.swap_psum():
    got = np.asarray(run(x))
  assert_bitwise(got, want)
  reasons = {"constant": [], "bool": ["platform"], "int16": ["dtype"],
             "axis_index_groups": ["axis_index_groups"]}[what]
  assert [d.reason for d in jax_llar.dispatch_log()] == reasons
  if what == "axis_index_groups":
    assert jax_llar.dispatch_log()[0].world_size == 2


def test_swap_from_the_environment():
  code = "import jax_llar; print(jax_llar.installed())"
  for value, want in (("1", "True"), ("0", "False"), ("", "False")):
    env = dict(user_env(), JAX_LLAR_SWAP=value, JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                         capture_output=True, text=True).stdout.strip()
    assert out == want, (value, out)
  env = dict(user_env(), JAX_LLAR_SWAP="maybe", JAX_PLATFORMS="cpu")
  p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                     text=True)
  assert p.returncode != 0 and "JAX_LLAR_SWAP" in p.stderr


def test_lowering_rules_are_registered_and_wrap_jax():
  rules = jax_llar.status()["swap"]["lowering_rules"]
  assert rules == {"psum": True, "psum_invariant": True}
  from jax._src.interpreters import mlir  # pylint: disable=g-import-not-at-top
  from jax._src.lax import parallel  # pylint: disable=g-import-not-at-top
  for prim in (parallel.psum_p, parallel.psum_invariant_p):
    rule = mlir._lowerings[prim].rule  # pylint: disable=protected-access
    assert rule.__name__ == f"jax_llar_{prim.name}_lowering"
    wrapped = getattr(rule.wrapped, "func", rule.wrapped)  # JAX's may be a partial
    assert wrapped.__module__ == "jax._src.lax.parallel", rule.wrapped
  assert swap.MARK_KEY == "jax_llar"


def test_unmarked_psum_lowers_exactly_as_jax():
  """With jax_llar imported and nothing requested, a psum's lowering is the
  wrapped rule's, unchanged (compared with the rule JAX registered)."""
  mesh = mesh_of((2,), ("x",))
  x = _sharded(mesh, random_input(np.random.default_rng(10), (2, 8), np.float32))
  f = jax.jit(jax.shard_map(lambda v: lax.psum(v, "x"), mesh=mesh,
                            in_specs=P("x"), out_specs=P()))
  from jax._src.interpreters import mlir  # pylint: disable=g-import-not-at-top
  from jax._src.lax import parallel  # pylint: disable=g-import-not-at-top
  ours = f.lower(x).as_text()
  saved = {p: mlir._lowerings[p] for p in (parallel.psum_p, parallel.psum_invariant_p)}  # pylint: disable=protected-access
  try:
    for p, entry in saved.items():
      mlir._lowerings[p] = type(entry)(entry.rule.wrapped, entry.inline)  # pylint: disable=protected-access
    jax.clear_caches()
    theirs = f.lower(x).as_text()
  finally:
    mlir._lowerings.update(saved)  # pylint: disable=protected-access
    jax.clear_caches()
  assert ours == theirs
  assert os.environ.get("JAX_LLAR_SWAP", "") in ("", "0")


def test_swap_psum_takes_a_bool_only():
  with pytest.raises(TypeError, match="a bool"):
    jax_llar.swap_psum("off")


def test_a_region_open_across_an_await_marks_other_tasks_and_must_end_in_its_task():
  """The documented limit (swap_psum's docstring): the mark is the thread's,
  so a task that traces while another task's block is open across an await
  is marked too; a block that ends in another task raises RuntimeError,
  after ending the mark."""
  import asyncio  # pylint: disable=g-import-not-at-top
  mesh = mesh_of((2,), ("x",))
  x = _sharded(mesh, random_input(np.random.default_rng(1), (2, 8), np.float32))

  async def main():
    opened, traced = asyncio.Event(), asyncio.Event()

    async def holder():
      with jax_llar.swap_psum():
        opened.set()
        await traced.wait()  # an await inside the block

    async def other():
      await opened.wait()
      f, _ = _counting_step(mesh)
      f(x)
      traced.set()

    await asyncio.gather(holder(), other())
    leaked = list(_log())
    jax_llar.clear_dispatch_log()

    cm = jax_llar.swap_psum()

    async def enter():
      cm.__enter__()

    async def leave():
      cm.__exit__(None, None, None)

    await asyncio.create_task(enter())
    with pytest.raises(RuntimeError, match="ended in"):
      await asyncio.create_task(leave())
    return leaked

  leaked = asyncio.run(main())
  assert leaked == [SWAP_DECISION]
  # The mark ended with the refused exit: a fresh trace is JAX's again.
  f, _ = _counting_step(mesh)
  f(x)
  assert _log() == []


def test_a_region_ended_in_another_thread_raises():
  cm = jax_llar.swap_psum()
  cm.__enter__()
  errors = []
  t = threading.Thread(target=lambda: errors.append(
      pytest.raises(RuntimeError, cm.__exit__, None, None, None)))
  t.start()
  t.join()
  assert errors and "another thread" in str(errors[0].value)
  cm.__exit__(None, None, None)  # ends it in its own thread
