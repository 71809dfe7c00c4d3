"""The native tools module on GPUs: the call trace, kernel variants through
the kernel bench, and the algorithm table against the extension's."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_llar
from jax_llar import _ext, algorithms, comm, testing
from jax_llar.tools import _native

from gpu_helpers import DTYPES, F32, run_program


def test_algorithms_match_extension():
  """algorithms.py's ids and limits are the loaded extension's."""
  mod = _ext.load()
  assert mod is not None, _ext.reason()
  assert {a.short_name: int(a) for a in algorithms.Algorithm} == dict(mod.ALGORITHMS)
  assert ({a.short_name: b for a, b in algorithms.MAX_BYTES.items()} ==
          dict(mod.MAX_BYTES))
  assert algorithms.MAX_RANKS == mod.MAX_RANKS
  assert algorithms.LARGEST_MAX_BYTES == max(dict(mod.MAX_BYTES).values())


def test_call_trace_records_every_call(mesh):
  """The kernels' call trace holds one send/end pair per call, in order,
  with positive durations; results stay exact while it is on; after
  disable_call_trace the same program records nothing more."""
  tools = _native.require("the call-trace test")
  cs = comm.get_or_create([[d.local_hardware_id for d in mesh.devices.flat]])
  tools.enable_call_trace(cs.comm_id)
  try:
    before = {d: tools.read_call_trace(cs.comm_id, d)[0] for d in cs.groups[0]}
    rng = np.random.default_rng(7)
    # A program compiled (and so captured) after the trace was enabled.
    traced = jax.jit(jax.shard_map(lambda v: jax_llar.psum(v, "x"), mesh=mesh,
                                   in_specs=P("x"), out_specs=P("x"), check_vma=False))

    def run_checked():
      inputs = [testing.random_array(rng, (300,), F32) for _ in range(mesh.size)]
      x = jax.device_put(np.stack(inputs), NamedSharding(mesh, P("x")))
      out = np.asarray(traced(x))
      expect = testing.rank_order_sum(inputs, F32)
      assert all(testing.bitwise_equal(o, expect) for o in out)

    for _ in range(20):
      run_checked()
    slots = tools.TRACE_SLOTS
    for d in cs.groups[0]:
      calls, words = tools.read_call_trace(cs.comm_id, d)
      assert calls == before[d] + 20
      idx = [e % slots for e in range(calls - 20, calls)]
      starts = [words[2 * i] for i in idx]
      ends = [words[2 * i + 1] for i in idx]
      assert all(s > 0 for s in starts)
      assert all(e > s for s, e in zip(starts, ends))
      assert all(b > a for a, b in zip(ends, starts[1:]))
  finally:
    tools.disable_call_trace(cs.comm_id)
  # Off again: the captured trace variant keeps computing and stores nothing.
  run_checked()
  for d in cs.groups[0]:
    calls, words = tools.read_call_trace(cs.comm_id, d)
    assert words[2 * ((calls - 1) % slots)] == 0


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_kernel_variants_on_random_data(dtype):
  """The run-time world-size kernel (used for groups of other than 2, 4 or 8
  ranks), the other grid rules, the send-and-loopback diagnostic and the
  one-shot without call signatures (compiled out, and signature 0), run
  through the kernel bench on this machine: bitwise against the reference
  (in a child program: the bench advances the set's epoch counters)."""
  p = run_program("kernel_variants", str(dtype))
  assert p.data is not None, p.tail
  assert p.data["checked"] == 6 * 7 and p.data["failures"] == [], p.tail
