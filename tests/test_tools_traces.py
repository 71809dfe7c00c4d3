"""jax_llar.tools.traces: statistics on synthetic traces with known answers,
and a real CPU trace read back through jax.profiler.ProfileData."""

import jax
import jax.numpy as jnp
import pytest

from jax_llar.tools import traces
from jax_llar.tools.traces import Event

KERNEL = "void llar::OneShotLLKernel<float, false>(llar::AllReduceArgs)"
GPU0, GPU1, HOST = "/device:GPU:0", "/device:GPU:1", "/host:CUPTI"
STREAM = "Stream #7"


def _device(process, t0, steps, period, stall_at=None, stall=0.0, first_wait=0.0):
  """One GPU's stream: per step our kernel (1.0 us) then a multiply (0.5 us).
  `first_wait` lengthens the first kernel (an all-reduce waiting for a late
  peer); `stall` is idle time before kernel `stall_at`."""
  evs, t = [], t0
  for i in range(steps):
    if i == stall_at:
      t += stall
    dur = 1.0 + (first_wait if i == 0 else 0.0)
    evs.append(Event(process, STREAM, KERNEL, t, dur))
    evs.append(Event(process, STREAM, "loop_multiply_fusion", t + dur + 0.2, 0.5))
    t += period + (first_wait if i == 0 else 0.0)
  return evs


def test_periods_stalls_and_skew():
  evs = []
  # Two executions 1000 us apart; GPU 1 starts 3 us late and stalls 20 us once.
  for call, base in enumerate((0.0, 1000.0)):
    evs += _device(GPU0, base, 10, 2.0)
    evs += _device(GPU1, base + 3.0, 10, 2.0, stall_at=5 if call == 0 else None, stall=20.0)
  host = [Event(HOST, "thread 1", "cuGraphLaunch", 0.0, 50.0),
          Event(HOST, "thread 2", "cuGraphLaunch", 1.0, 70.0)]
  s = traces.trace_stats(evs + host, calls=2)
  g0, g1 = s["devices"][GPU0], s["devices"][GPU1]
  assert g0["our_kernels"] == 20 and g0["executions_found"] == 2
  assert g0["stream"] == STREAM
  assert g0["period_us_median"] == pytest.approx(2.0)
  assert g0["period_us_mean"] == pytest.approx(2.0)
  assert g0["stalls_over_5us"] == 0
  # The stall shows in the mean period and as one gap over 5 us, not in the median.
  assert g1["period_us_median"] == pytest.approx(2.0)
  assert g1["period_us_mean"] == pytest.approx(2.0 + 20.0 / 16)
  assert g1["stalls_over_5us"] == 1
  assert g1["stall_us_max"] == pytest.approx(20.0 + 0.3)
  assert s["start_skew_us"] == pytest.approx([3.0, 3.0])
  assert s["graph_launch_us"] == [50.0, 70.0]
  assert s["host_top"][0] == {"name": "cuGraphLaunch", "count": 2, "total_us": 120.0}


def test_long_stall_inside_an_execution_is_a_stall_not_a_boundary():
  # 3 executions 5000 us apart; a 300 us stall inside the first one.
  evs = []
  for call, base in enumerate((0.0, 5000.0, 10000.0)):
    evs += _device(GPU0, base, 10, 2.0, stall_at=4 if call == 0 else None, stall=300.0)
  s = traces.trace_stats(evs, calls=3)
  g = s["devices"][GPU0]
  assert g["executions_found"] == 3
  assert g["stalls_over_5us"] == 1
  assert g["stall_us_max"] == pytest.approx(300.3)
  assert g["period_us_median"] == pytest.approx(2.0)
  assert g["period_us_mean"] == pytest.approx(2.0 + 300.0 / 24)


def test_first_kernel_wait_is_reported_apart():
  # The GPU that starts first waits 400 us in its first all-reduce.
  evs = _device(GPU0, 0.0, 10, 2.0, first_wait=400.0) + _device(GPU1, 400.0, 10, 2.0)
  s = traces.trace_stats(evs, calls=1)
  g0, g1 = s["devices"][GPU0], s["devices"][GPU1]
  assert g0["first_kernel_us_median"] == pytest.approx(401.0)
  assert g1["first_kernel_us_median"] == pytest.approx(1.0)
  assert g0["period_us_mean"] == pytest.approx(2.0)
  assert g0["stalls_over_5us"] == 0
  assert s["start_skew_us"] == pytest.approx([400.0])


def test_no_kernels_gives_no_devices():
  s = traces.trace_stats([Event("/host:CPU", "thread 1", "other", 0.0, 1.0)], calls=1)
  assert s["devices"] == {} and s["start_skew_us"] == []


def test_other_events_before_the_first_call_do_not_move_the_split():
  # A copy on the same stream long before the profiled calls (seen in real traces).
  early = [Event(GPU0, STREAM, "MemcpyHtoD", -9000.0, 3.0)]
  evs = early + _device(GPU0, 0.0, 10, 2.0) + _device(GPU0, 3000.0, 10, 2.0)
  s = traces.trace_stats(evs, calls=2)
  g = s["devices"][GPU0]
  assert g["executions_found"] == 2
  assert g["stalls_over_5us"] == 0
  assert g["period_us_mean"] == pytest.approx(2.0)


def test_kernels_on_a_second_line_of_the_device_do_not_count_twice():
  # A device plane may hold our kernels on more than one line; the stream
  # with most of them is the one measured.
  evs = _device(GPU0, 0.0, 10, 2.0)
  evs += [e._replace(thread="derived line") for e in evs[:4:2]]
  s = traces.trace_stats(evs, calls=1)
  assert s["devices"][GPU0]["our_kernels"] == 10


def test_timeline_medians():
  evs = _device(GPU0, 0.0, 10, 2.0)
  t = traces.timeline(evs)[GPU0]
  assert t["n"] == 10
  assert t["our_kernel_us"] == pytest.approx(1.0)
  assert t["other_kernels_us"] == pytest.approx(0.5)
  assert t["period_us"] == pytest.approx(2.0)
  assert t["other_names"] == ["loop_multiply_fusion"]


def test_kernel_names_mangled_or_not():
  assert traces.ours(Event(GPU0, STREAM, KERNEL, 0.0, 1.0))
  assert traces.ours(Event(GPU0, STREAM, "_ZN4llar15OneShotLLKernelIfLb0EEEvNS_13AllReduceArgsE",
                           0.0, 1.0))
  assert traces.ours(Event(GPU0, STREAM, "void llar::CopyKernel<16>(...)", 0.0, 1.0))
  assert not traces.ours(Event(GPU0, STREAM, "loop_multiply_fusion", 0.0, 1.0))


def test_cpu_trace_read_back_through_profile_data():
  """A tiny jitted function profiled on CPU: the reader finds the host plane
  and events with positive durations; no kernel of ours, so no devices."""
  f = jax.jit(lambda x: jnp.sin(x) @ x)
  x = jnp.ones((128, 128), jnp.float32)
  f(x).block_until_ready()
  events = traces.profile(f, x, calls=3)
  processes = {e.process for e in events}
  assert any(p.startswith("/host:") for p in processes), processes
  timed = [e for e in events if e.dur > 0]
  assert timed, "no event with a positive duration"
  assert all(isinstance(e.ts, float) and e.dur >= 0 for e in events)
  assert traces.trace_stats(events, calls=3)["devices"] == {}


def test_device_calls_cut_at_idle_gaps():
  """Kernels come back per call, in start order, cut where the device idles
  longer than the gap; host events and instant events are left out; a
  kernel that starts inside a long earlier one's span stays in its call."""
  evs = [Event(GPU0, STREAM, "b", 5.0, 1.0), Event(GPU0, STREAM, "a", 0.0, 900.0),
         Event(GPU0, STREAM, "c", 2000.0, 1.0), Event(GPU0, STREAM, "d", 2500.0, 1.0),
         Event(HOST, "thread 1", "cuGraphLaunch", 1500.0, 5.0),
         Event(GPU0, STREAM, "marker", 1500.0, 0.0)]
  calls = traces.device_calls(evs, gap_us=1000.0)
  assert [[e.name for e in c] for c in calls] == [["a", "b"], ["c", "d"]]
  assert [[e.name for e in c] for c in traces.device_calls(evs, gap_us=100.0)] == [
      ["a", "b"], ["c"], ["d"]]
  assert traces.device_calls([]) == []
