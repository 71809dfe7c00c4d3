"""The loopback group's Python side without a GPU (jax_llar.tools.loopback.group):
bad arguments are refused with the reason before anything native runs, a
group needs a CUDA device and says so, and the calls lower for CUDA to the
loopback targets with their attributes and names (the GPU tests, in
tests/gpu1/test_loopback_group.py, run them)."""

from __future__ import annotations

import jax
import numpy as np
import jax.numpy as jnp
import pytest

from jax_llar import algorithms
from jax_llar.tools.loopback import group as loopback_group
from jax_llar.tools.loopback.group import LoopbackGroup


@pytest.mark.parametrize("world", [0, 1, algorithms.MAX_RANKS + 1, 2.5, "2"])
def test_world_outside_two_to_max_ranks_is_refused(world):
  with pytest.raises(ValueError, match=f"world must be an integer 2-{algorithms.MAX_RANKS}"):
    LoopbackGroup(world)


def test_algorithms_needing_nccl_are_refused():
  with pytest.raises(ValueError, match="NCCL's device communicator"):
    LoopbackGroup(2, algorithms=["nccl_lla2a_one_shot"])
  with pytest.raises(ValueError, match="no algorithm|unknown|one_shot_lx"):
    LoopbackGroup(2, algorithms=["one_shot_lx"])
  with pytest.raises(ValueError, match="at least one"):
    LoopbackGroup(2, algorithms=[])


@pytest.mark.parametrize("bad", [None, 3, [None], ["one_shot_ll", 99]])
def test_algorithms_that_are_not_names_or_ids_are_refused(bad):
  with pytest.raises(ValueError):
    LoopbackGroup(2, algorithms=bad)


@pytest.mark.parametrize("bad", [0, -1, float("nan"), 600_001, "1000"])
def test_timeouts_outside_the_bound_are_refused(bad):
  with pytest.raises(ValueError, match="timeout_ms"):
    LoopbackGroup(2, timeout_ms=bad)


def test_one_algorithm_may_be_named_alone():
  with pytest.raises(RuntimeError, match="CUDA device"):  # past the argument checks
    LoopbackGroup(2, algorithms="two_shot_ll")


def test_a_group_needs_a_cuda_device():
  with pytest.raises(RuntimeError, match="CUDA device"):
    LoopbackGroup(2)


def test_every_algorithm_but_the_nccl_one_can_be_held():
  assert set(loopback_group.ALGORITHMS) == set(algorithms.Algorithm) - {
      algorithms.Algorithm.NCCL_LLA2A_ONE_SHOT}


def _lowered(fn, *args, platform):
  return jax.jit(fn).trace(*args).lower(lowering_platforms=(platform,)).as_text(
      debug_info=True)


def test_the_all_reduce_lowers_to_its_target_for_cuda():
  x = jnp.zeros((2, 1024), jnp.float32)
  text = _lowered(lambda v: loopback_group._all_reduce_p.bind(
      v, group_id=5, algorithm=2, world=2), x, platform="cuda")
  assert "jax_llar_loopback_all_reduce" in text, text
  assert "group_id = 5" in text and "algorithm = 2" in text and "signature =" in text, text
  assert "jax_llar.loopback.two_shot_ll.f32.4096B.2ranks" in text, text


def test_the_fused_op_lowers_to_its_target_for_cuda():
  x = jnp.zeros((2, 4, 64), jnp.bfloat16)
  w = jnp.ones((64,), jnp.bfloat16)
  text = _lowered(lambda a, b, c: loopback_group._add_rms_norm_p.bind(
      a, b, c, group_id=3, eps=1e-5, world=2), x, x, w, platform="cuda")
  assert "jax_llar_loopback_add_rms_norm" in text and "group_id = 3" in text, text
  assert "jax_llar.loopback.one_shot_ll_add_rms_norm.bf16.512B.2ranks" in text, text


def test_every_call_of_a_module_gets_a_signature_of_its_own():
  """Equal calls in one module are lowered one by one (the rule is not
  cacheable), so each carries its own signature, as the fast path's do."""
  x = jnp.zeros((2, 64), jnp.float32)
  def chain(v):
    for _ in range(3):
      v = loopback_group._all_reduce_p.bind(v, group_id=1, algorithm=1, world=2)
    return v
  text = _lowered(chain, x, platform="cuda")
  import re  # pylint: disable=g-import-not-at-top
  sigs = re.findall(r"signature = (\d+)", text)
  assert len(sigs) == 3 and len(set(sigs)) == 3, sigs


def test_concurrent_command_buffer_scheduling_is_refused(monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_command_buffer_scheduling_mode=CONCURRENT")
  g = LoopbackGroup.__new__(LoopbackGroup)  # the check runs before any native call
  g.world, g.algorithms = 2, (algorithms.Algorithm.ONE_SHOT_LL,)
  with pytest.raises(ValueError, match="concurrent command-buffer scheduling"):
    g.psum(jnp.zeros((2, 8), jnp.float32))


def test_other_platforms_are_told_it_runs_on_cuda_only():
  x = jnp.zeros((2, 8), jnp.float32)
  with pytest.raises(NotImplementedError, match="CUDA only"):
    _lowered(lambda v: loopback_group._all_reduce_p.bind(
        v, group_id=1, algorithm=1, world=2), x, platform="cpu")


def test_the_graph_child_knows_the_loopback_chain():
  from jax_llar.tools import capture  # pylint: disable=g-import-not-at-top
  from jax_llar.tools.programs import graph_child  # pylint: disable=g-import-not-at-top
  assert capture.TARGETS["loopback"] == loopback_group.TARGET_ALL_REDUCE
  assert graph_child.main(["graph_child", "/tmp/unused", "nonsense"]) == 2


def test_the_xla_modes_emulation_is_the_chain_it_checks():
  """loopback_xla.emulate: `calls` all-reduces in rank order with the exact
  step between them (floats halved, int32 shifted), every rank the same."""
  import ml_dtypes  # pylint: disable=g-import-not-at-top
  from jax_llar import testing  # pylint: disable=g-import-not-at-top
  from jax_llar.tools.loopback import xla as loopback_xla  # pylint: disable=g-import-not-at-top
  np_ = np
  rng = np.random.default_rng(0)
  for dtype in (np_.float32, ml_dtypes.bfloat16, np_.int32):
    x = np_.stack([testing.random_array(rng, (33,), dtype) for _ in range(3)])
    s1 = testing.rank_order_sum(list(x), dtype)
    step = (s1 >> 1) if np_.dtype(dtype) == np_.int32 else (
        s1.astype(np_.float64) * 0.5).astype(dtype)
    s2 = testing.rank_order_sum([step] * 3, dtype)
    got = loopback_xla.emulate(x, 2)
    assert got.shape == x.shape and got.dtype == x.dtype
    for r in range(3):
      assert testing.bitwise_equal(got[r], s2)
  assert loopback_xla.skip_reason("one_shot_sentinel", "int32", 8) is not None
  assert "whole number" in loopback_xla.skip_reason("one_shot_ll", "float32", 6)
  assert loopback_xla.skip_reason("one_shot_ll", "float32", 8) is None
