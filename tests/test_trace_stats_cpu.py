"""graphcheck.trace_stats on synthetic profiler traces with known answers."""

import pytest

from jax_llar import graphcheck

KERNEL = "void llar::OneShotLLKernel<float, false>(llar::AllReduceArgs)"


def _device(pid, t0, steps, period, stall_at=None, stall=0.0, first_wait=0.0):
  """One GPU's stream: per step our kernel (1.0 us) then a multiply (0.5 us).
  `first_wait` lengthens the first kernel (an all-reduce waiting for a late
  peer); `stall` is idle time before kernel `stall_at`."""
  evs, t = [], t0
  for i in range(steps):
    if i == stall_at:
      t += stall
    dur = 1.0 + (first_wait if i == 0 else 0.0)
    evs.append({"ph": "X", "pid": pid, "tid": 7, "ts": t, "dur": dur, "name": KERNEL})
    evs.append({"ph": "X", "pid": pid, "tid": 7, "ts": t + dur + 0.2, "dur": 0.5,
                "name": "loop_multiply_fusion"})
    t += period + (first_wait if i == 0 else 0.0)
  return evs


def _meta():
  return [{"ph": "M", "name": "process_name", "pid": p, "args": {"name": n}}
          for p, n in ((1, "/device:GPU:0"), (2, "/device:GPU:1"), (9, "/host:CPU"))]


def test_periods_stalls_and_skew():
  evs = []
  # Two executions 1000 us apart; GPU 1 starts 3 us late and stalls 20 us once.
  for call, base in enumerate((0.0, 1000.0)):
    evs += _device(1, base, 10, 2.0)
    evs += _device(2, base + 3.0, 10, 2.0, stall_at=5 if call == 0 else None, stall=20.0)
  host = [{"ph": "X", "pid": 9, "tid": 1, "ts": 0.0, "dur": 50.0, "name": "cuGraphLaunch"},
          {"ph": "X", "pid": 9, "tid": 2, "ts": 1.0, "dur": 70.0, "name": "cuGraphLaunch"}]
  s = graphcheck.trace_stats(_meta() + evs + host, calls=2)
  g0, g1 = s["devices"]["/device:GPU:0"], s["devices"]["/device:GPU:1"]
  assert g0["our_kernels"] == 20 and g0["executions_found"] == 2
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
    evs += _device(1, base, 10, 2.0, stall_at=4 if call == 0 else None, stall=300.0)
  s = graphcheck.trace_stats(_meta() + evs, calls=3)
  g = s["devices"]["/device:GPU:0"]
  assert g["executions_found"] == 3
  assert g["stalls_over_5us"] == 1
  assert g["stall_us_max"] == pytest.approx(300.3)
  assert g["period_us_median"] == pytest.approx(2.0)
  assert g["period_us_mean"] == pytest.approx(2.0 + 300.0 / 24)


def test_first_kernel_wait_is_reported_apart():
  # The GPU that starts first waits 400 us in its first all-reduce.
  evs = _device(1, 0.0, 10, 2.0, first_wait=400.0) + _device(2, 400.0, 10, 2.0)
  s = graphcheck.trace_stats(_meta() + evs, calls=1)
  g0, g1 = s["devices"]["/device:GPU:0"], s["devices"]["/device:GPU:1"]
  assert g0["first_kernel_us_median"] == pytest.approx(401.0)
  assert g1["first_kernel_us_median"] == pytest.approx(1.0)
  assert g0["period_us_mean"] == pytest.approx(2.0)
  assert g0["stalls_over_5us"] == 0
  assert s["start_skew_us"] == pytest.approx([400.0])


def test_no_kernels_gives_no_devices():
  s = graphcheck.trace_stats([{"ph": "X", "pid": 1, "tid": 1, "ts": 0.0, "dur": 1.0,
                               "name": "other"}], calls=1)
  assert s["devices"] == {} and s["start_skew_us"] == []


def test_other_events_before_the_first_call_do_not_move_the_split():
  # A copy on the same stream long before the profiled calls (seen in real traces).
  early = [{"ph": "X", "pid": 1, "tid": 7, "ts": -9000.0, "dur": 3.0, "name": "MemcpyHtoD"}]
  evs = early + _device(1, 0.0, 10, 2.0) + _device(1, 3000.0, 10, 2.0)
  s = graphcheck.trace_stats(_meta() + evs, calls=2)
  g = s["devices"]["/device:GPU:0"]
  assert g["executions_found"] == 2
  assert g["stalls_over_5us"] == 0
  assert g["period_us_mean"] == pytest.approx(2.0)
