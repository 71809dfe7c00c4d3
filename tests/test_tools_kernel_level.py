"""jax_llar.tools.bench.kernel_level without a GPU: impl names map to the native
kernel bench's structured arguments, and outputs are checked against the
right reference."""

from __future__ import annotations

import json

import numpy as np
import pytest

from jax_llar import testing
from jax_llar.algorithms import MAX_BYTES, Algorithm
from jax_llar.tools.bench import jax_level as jax_level
from jax_llar.tools.bench import kernel_level as kernel_level
from jax_llar.tools.bench.kernel_level import KERNEL_IMPLS, KernelImpl


class FakeTools:
  """Records kernel_bench calls; returns each rank's own input as output."""
  DTYPE_CODES = {"float32": 0, "bfloat16": 1, "float16": 2}

  def __init__(self):
    self.calls = []

  def kernel_bench(self, comm_id, kind, dtype, inputs, iters, reps, variant="",
                   generic=False, block_lines=0, signature=0):
    self.calls.append(dict(comm_id=comm_id, kind=kind, dtype=dtype, iters=iters,
                           reps=reps, variant=variant, generic=generic,
                           block_lines=block_lines, n=len(inputs), signature=signature))
    return [[1.5] * len(inputs) for _ in range(reps)], list(inputs)


SIG = kernel_level.BENCH_SIGNATURE


@pytest.mark.parametrize("impl,kind,variant,generic,block_lines,signature", [
    ("llar.one_shot_ll", "one_shot_ll", "", False, 0, SIG),
    ("kernel.copy", "copy", "", False, 0, SIG),
    ("nccl.allreduce", "nccl", "", False, 0, SIG),
    ("diag.one_shot_ll_loopback", "one_shot_ll", "loopback", False, 0, SIG),
    ("diag.one_shot_ll_send_loopback", "one_shot_ll", "send_loopback", False, 0, SIG),
    ("diag.one_shot_ll_traced", "one_shot_ll", "traced", False, 0, SIG),
    ("diag.one_shot_ll_generic", "one_shot_ll", "", True, 0, SIG),
    ("diag.one_shot_ll_b128", "one_shot_ll", "", False, 128, SIG),
    ("diag.one_shot_ll_b256", "one_shot_ll", "", False, 256, SIG),
    # What signatures cost: the kernel compiled without them; and signature 0.
    ("diag.one_shot_ll_unsigned", "one_shot_ll", "unsigned", False, 0, 0),
    ("diag.one_shot_ll_sig0", "one_shot_ll", "", False, 0, 0),
])
def test_impl_names_map_to_structured_arguments(impl, kind, variant, generic, block_lines,
                                                signature):
  tools = FakeTools()
  inputs = [np.arange(5, dtype=np.float32) + r for r in range(2)]
  us, outs = kernel_level.bench(tools, 7, KERNEL_IMPLS[impl], inputs, 50, 3)
  (call,) = tools.calls
  assert call == dict(comm_id=7, kind=kind, dtype=0, iters=50, reps=3, variant=variant,
                      generic=generic, block_lines=block_lines, n=2, signature=signature)
  assert us == [[1.5, 1.5]] * 3
  assert all(o.dtype == np.float32 for o in outs)


def test_the_production_kernel_is_the_algorithms_impl():
  assert KERNEL_IMPLS[Algorithm.ONE_SHOT_LL.impl] == KernelImpl("one_shot_ll")


def test_references_per_expectation():
  dt = jax_level.DTYPES["bf16"]
  rng = np.random.default_rng(0)
  inputs = [testing.random_array(rng, (33,), dt) for _ in range(2)]
  total = testing.rank_order_sum(inputs, dt)
  copy, loop, summed = (KERNEL_IMPLS[i] for i in (
      "kernel.copy", "diag.one_shot_ll_loopback", "llar.one_shot_ll"))
  assert kernel_level.outputs_correct(copy, inputs, inputs, dt)
  assert not kernel_level.outputs_correct(summed, inputs, inputs, dt)
  assert kernel_level.outputs_correct(summed, [total, total], inputs, dt)
  doubled = [testing.rank_order_sum([x, x], dt) for x in inputs]
  assert kernel_level.outputs_correct(loop, doubled, inputs, dt)
  assert not kernel_level.outputs_correct(loop, [total, total], inputs, dt)


def test_nccl_beyond_two_ranks_is_compared_within_tolerance():
  dt = np.dtype(np.float32)
  rng = np.random.default_rng(1)
  inputs = [testing.random_array(rng, (64,), dt) for _ in range(4)]
  total = testing.rank_order_sum(inputs, dt)
  nudged = np.nextafter(total, np.float32(np.inf))
  nccl = KERNEL_IMPLS["nccl.allreduce"]
  assert kernel_level.outputs_correct(nccl, [nudged] * 4, inputs, dt)
  assert not kernel_level.outputs_correct(nccl, [nudged] * 2, inputs[:2], dt)


def test_default_sizes_reach_the_one_shot_limit():
  assert max(kernel_level.Settings().sizes) == MAX_BYTES[Algorithm.ONE_SHOT_LL]


def test_sol_compares_every_all_reduce_of_a_kernel_file(tmp_path):
  from jax_llar.tools import sol  # pylint: disable=g-import-not-at-top
  rows = [
      {"impl": "llar.one_shot_ll", "dtype": "float32", "bytes_per_rank": 1024,
       "us_per_call": 2.0, "correct": True},
      {"impl": "llar.one_shot_ll", "dtype": "float32", "bytes_per_rank": 64,
       "us_per_call": 1.5, "correct": True},
      {"impl": "llar.two_shot_ll", "dtype": "float32", "bytes_per_rank": 64,
       "us_per_call": 3.0, "correct": False},   # failed its check: not compared
      {"impl": "llar.two_shot_ll", "dtype": "float32", "bytes_per_rank": 4096,
       "us_per_call": 3.5, "correct": True},
      {"impl": "nccl.allreduce", "dtype": "float32", "bytes_per_rank": 64,
       "us_per_call": 9.0, "correct": True},
      {"impl": "kernel.copy", "dtype": "float32", "bytes_per_rank": 64,
       "us_per_call": 0.9, "correct": True},     # no all-reduce
      {"impl": "diag.one_shot_ll_loopback", "dtype": "float32", "bytes_per_rank": 64,
       "us_per_call": 1.1, "correct": True},
  ]
  path = tmp_path / "k.json"
  path.write_text(json.dumps({"rows": rows}))
  got = sol.kernel_figures(None, str(path))
  assert [(i, us) for i, us, _ in got] == [
      ("llar.one_shot_ll", 1.5), ("llar.two_shot_ll", 3.5), ("nccl.allreduce", 9.0)]
  assert "64 B" in got[0][2] and "4096 B" in got[1][2]
  assert sol.kernel_figures(2.5, None) == [("llar.one_shot_ll", 2.5, "--kernel_us")]
  # A missing or unreadable file is refused before the probes run (issue 23).
  from jax_llar.tools import _cli  # pylint: disable=g-import-not-at-top
  with pytest.raises(_cli.Refused, match="no such file"):
    sol.kernel_figures(None, str(tmp_path / "missing.json"))
  (tmp_path / "bad.json").write_text("{not json")
  with pytest.raises(_cli.Refused, match="not a readable JSON file"):
    sol.kernel_figures(None, str(tmp_path / "bad.json"))
  assert sol.kernel_figures(None, None) == []
