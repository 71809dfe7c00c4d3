"""jax_llar.swap_psum: ``jax.lax.psum`` means ``jax_llar.psum`` inside it.

The swap is part of jit's cache key (issue 15, item 2): a function traced
outside the block and called inside it is traced again and takes jax_llar,
and the other way round. Each test observes this twice: a trace-time side
effect (whether ``jax.lax.psum`` resolves to ``jax_llar.psum`` in the
tracing thread while the body is traced) and the dispatch log (only
jax_llar's psums are recorded).

While any block is active ``jax.lax.psum`` is the swap's dispatcher, which
picks per calling thread; outside every block it is JAX's function again.
"""

from __future__ import annotations

import threading

import jax
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import jax_llar
from jax_llar import swap

from cpu_helpers import assert_bitwise, mesh_of, random_input, shard_psum


@pytest.fixture(autouse=True)
def restore_lax_psum():
  """Puts lax.psum back if a test (of a swap bug) left it swapped."""
  yield
  if jax.lax.psum is not swap._original or swap._depth:  # pylint: disable=protected-access
    swap._depth = 0  # pylint: disable=protected-access
    jax.lax.psum = swap._original  # pylint: disable=protected-access


def _takes_llar() -> bool:
  """Whether ``jax.lax.psum``, called now in this thread, is jax_llar's."""
  psum = jax.lax.psum
  if psum is swap._dispatch:  # pylint: disable=protected-access
    psum = swap._resolve()  # pylint: disable=protected-access
  return psum is jax_llar.psum


def _psum_jaxpr_text(x, mesh):
  return str(jax.make_jaxpr(jax.shard_map(
      lambda v: jax.lax.psum(v, "x"), mesh=mesh, in_specs=P("x"),
      out_specs=P()))(x))


def _recording_step(mesh):
  """A jitted shard_map psum through the attribute jax.lax.psum, and the list
  its body appends to at each trace: True when the trace saw jax_llar."""
  traces = []

  def body(v):
    traces.append(_takes_llar())
    return jax.lax.psum(v, "x")

  return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"),
                               out_specs=P())), traces


def test_swap_psum_context_and_decorator():
  mesh = mesh_of((2,), ("x",))
  x = random_input(np.random.default_rng(23), (2, 3), np.float32)
  original = jax.lax.psum
  assert original is not jax_llar.psum
  with jax_llar.swap_psum():
    assert jax.lax.psum is swap._dispatch  # pylint: disable=protected-access
    assert _takes_llar()
    text = _psum_jaxpr_text(x, mesh)
    with jax_llar.swap_psum():  # nesting two instances keeps the swap
      pass
    assert jax.lax.psum is swap._dispatch  # pylint: disable=protected-access
    assert _takes_llar()
  assert "llar_psum" in text and "psum_invariant" not in text
  assert jax.lax.psum is original
  text = _psum_jaxpr_text(x, mesh)
  assert "llar_psum" not in text and "psum_invariant" in text

  @jax_llar.swap_psum()
  def traced(v):
    return _psum_jaxpr_text(v, mesh)

  assert "llar_psum" in traced(x)
  assert jax.lax.psum is original
  with pytest.raises(ZeroDivisionError):
    with jax_llar.swap_psum():
      _ = 1 / 0
  assert jax.lax.psum is original


def test_swap_psum_traced_inside_compiled_outside():
  """The documented pattern: jit outside, the swap around the traced code."""
  mesh = mesh_of((2,), ("x",))
  x = random_input(np.random.default_rng(24), (2, 3), np.float32)

  @jax.jit
  @jax_llar.swap_psum()
  def step(v):
    return jax.shard_map(lambda w: jax.lax.psum(w, "x"), mesh=mesh,
                         in_specs=P("x"), out_specs=P())(v)

  got = np.asarray(step(x))
  assert_bitwise(got, shard_psum(lax.psum, mesh, "x", x)[0:1])
  assert [d.reason for d in jax_llar.dispatch_log()] == ["platform"]


def test_jit_decorator_pattern_traces_once_with_jax_llar():
  """``@jax.jit @swap_psum()``: the swap is active while jit traces, so the
  one trace takes jax_llar, and later calls (outside any block) reuse it."""
  mesh = mesh_of((2,), ("x",))
  x = random_input(np.random.default_rng(30), (2, 3), np.float32)
  traces = []

  def body(v):
    traces.append(_takes_llar())
    return jax.lax.psum(v, "x")

  @jax.jit
  @jax_llar.swap_psum()
  def step(v):
    return jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P())(v)

  outs = [np.asarray(step(x)) for _ in range(3)]
  assert traces == [True]
  assert len(jax_llar.dispatch_log()) == 1
  assert jax.lax.psum is swap._original  # pylint: disable=protected-access
  for o in outs:
    assert_bitwise(o, shard_psum(lax.psum, mesh, "x", x)[0:1])


def test_called_outside_then_inside_retraces_with_jax_llar():
  """Issue 15, item 2: a cached trace made outside the block must not serve
  a call inside it."""
  mesh = mesh_of((2,), ("x",))
  x = random_input(np.random.default_rng(31), (2, 3), np.float32)
  step, traces = _recording_step(mesh)
  want = np.asarray(step(x))
  assert traces == [False]
  assert jax_llar.dispatch_log() == []
  with jax_llar.swap_psum():
    got = np.asarray(step(x))
  assert traces == [False, True]
  assert [(d.reason, d.world_size) for d in jax_llar.dispatch_log()] == [
      ("platform", 2)]
  assert_bitwise(got, want)
  # Each context keeps its own cache entry: no further traces.
  step(x)
  with jax_llar.swap_psum():
    step(x)
  assert traces == [False, True]
  assert len(jax_llar.dispatch_log()) == 1


def test_traced_inside_then_called_outside_retraces_with_lax():
  """Issue 15, item 2, the other direction: a trace made inside the block
  must not keep jax_llar after the block ends."""
  mesh = mesh_of((2,), ("x",))
  x = random_input(np.random.default_rng(32), (2, 3), np.float32)
  step, traces = _recording_step(mesh)
  with jax_llar.swap_psum():
    got = np.asarray(step(x))
  assert traces == [True]
  assert len(jax_llar.dispatch_log()) == 1
  want = np.asarray(step(x))
  assert traces == [True, False]
  assert len(jax_llar.dispatch_log()) == 1  # lax.psum records nothing
  assert_bitwise(got, want)
  lowered = step.trace(x).lower().as_text()
  assert len(jax_llar.dispatch_log()) == 1 and "all_reduce" in lowered


def test_inner_jit_cached_outside_retraces_inside():
  """A jitted function called from a traced function inside the block: its
  cache entry from outside is not reused either."""
  mesh = mesh_of((2,), ("x",))
  x = random_input(np.random.default_rng(33), (2, 3), np.float32)
  inner, traces = _recording_step(mesh)
  inner(x)

  @jax.jit
  def outer(v):
    return inner(v) * 2

  with jax_llar.swap_psum():
    outer(x)
  assert traces == [False, True]
  assert len(jax_llar.dispatch_log()) == 1


def test_swap_state_is_per_thread_in_the_cache_key():
  """The cache key is the calling thread's: a thread outside the block does
  not take the block's entry, and the dispatcher gives it JAX's psum."""
  mesh = mesh_of((2,), ("x",))
  x = random_input(np.random.default_rng(34), (2, 3), np.float32)
  step, traces = _recording_step(mesh)
  entered, done = threading.Event(), threading.Event()

  def in_block():
    with jax_llar.swap_psum():
      step(x)
      entered.set()
      done.wait(10)

  t = threading.Thread(target=in_block)
  t.start()
  assert entered.wait(10)
  assert swap._swapped.value is False  # pylint: disable=protected-access
  assert jax.lax.psum is swap._dispatch  # pylint: disable=protected-access
  assert not _takes_llar()
  done.set()
  t.join(10)
  step(x)  # outside the block in this thread: not the block's entry
  assert traces == [True, False]


@pytest.mark.parametrize("what", ["compile-inside", "constant", "bool"])
def test_swap_psum_fallbacks_inside_swap(what):
  mesh = mesh_of((2,), ("x",))
  x = random_input(np.random.default_rng(25), (2, 3), np.float32)
  body = {"compile-inside": lambda v: jax.lax.psum(v, "x"),
          "constant": lambda v: jax.lax.psum(1, "x") * v,
          "bool": lambda v: jax.lax.psum(v > 0, "x")}[what]
  f = lambda: np.asarray(jax.jit(jax.shard_map(  # pylint: disable=g-long-lambda
      body, mesh=mesh, in_specs=P("x"), out_specs=P(
          "x" if what == "constant" else None)))(x))
  want = f()
  with jax_llar.swap_psum():
    got = f()
  assert_bitwise(got, want)


def test_swap_psum_same_instance_reentered():
  s = jax_llar.swap_psum()
  with s:
    with s:
      assert _takes_llar()
      assert swap._swapped.value is True  # pylint: disable=protected-access
    assert _takes_llar()
    assert swap._swapped.value is True  # pylint: disable=protected-access
  assert jax.lax.psum is swap._original  # pylint: disable=protected-access
  assert swap._swapped.value is False  # pylint: disable=protected-access


def test_other_thread_traces_lax_psum_while_a_block_is_active():
  """While thread A holds a block open, a function jitted and traced in
  another thread (outside any block) takes JAX's psum: the attribute agrees
  with that thread's cache key, so the cached trace is JAX's for good."""
  mesh = mesh_of((2,), ("x",))
  x = random_input(np.random.default_rng(35), (2, 3), np.float32)
  entered, done = threading.Event(), threading.Event()

  def hold_block():
    with jax_llar.swap_psum():
      entered.set()
      done.wait(30)

  t = threading.Thread(target=hold_block)
  t.start()
  try:
    assert entered.wait(30)
    step = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, "x"), mesh=mesh,
                                 in_specs=P("x"), out_specs=P()))
    got = np.asarray(step(x))
    assert jax_llar.dispatch_log() == []  # no jax_llar decision for it
  finally:
    done.set()
    t.join(30)
  assert not t.is_alive()
  assert jax.lax.psum is swap._original  # pylint: disable=protected-access
  text = str(jax.make_jaxpr(step)(x))  # the cached trace, outside the block
  assert "psum_invariant" in text and "llar_psum" not in text, text
  assert jax_llar.dispatch_log() == []
  assert_bitwise(got, shard_psum(lax.psum, mesh, "x", x)[0:1])


def test_reference_taken_inside_a_block_keeps_dispatching():
  """``from jax.lax import psum`` inside a block gets the dispatcher: JAX's
  psum outside every block, jax_llar's inside one."""
  mesh = mesh_of((2,), ("x",))
  x = random_input(np.random.default_rng(36), (2, 3), np.float32)
  with jax_llar.swap_psum():
    from jax.lax import psum as kept  # pylint: disable=g-import-not-at-top
  assert kept is swap._dispatch  # pylint: disable=protected-access

  def text():
    return str(jax.make_jaxpr(jax.shard_map(
        lambda v: kept(v, "x"), mesh=mesh, in_specs=P("x"), out_specs=P()))(x))

  assert "psum_invariant" in text() and "llar_psum" not in text()
  with jax_llar.swap_psum():
    assert "llar_psum" in text()
