"""graphcheck.trace_stats on a synthetic profiler trace with known answers."""

import pytest

from jax_llar import graphcheck

KERNEL = "void llar::OneShotLLKernel<float>(llar::AllReduceArgs)"


def _device(pid, t0, steps, period, stall_at=None, stall=0.0):
  """One GPU's stream: per step our kernel (1.0 us) then a multiply (0.5 us)."""
  evs, t = [], t0
  for i in range(steps):
    if i == stall_at:
      t += stall
    evs.append({"ph": "X", "pid": pid, "tid": 7, "ts": t, "dur": 1.0, "name": KERNEL})
    evs.append({"ph": "X", "pid": pid, "tid": 7, "ts": t + 1.2, "dur": 0.5,
                "name": "loop_multiply_fusion"})
    t += period
  return evs


def _trace():
  meta = [{"ph": "M", "name": "process_name", "pid": p, "args": {"name": n}}
          for p, n in ((1, "/device:GPU:0"), (2, "/device:GPU:1"), (9, "/host:CPU"))]
  evs = []
  # Two executions 1000 us apart; GPU 1 starts 3 us late and stalls 20 us once.
  for call, base in enumerate((0.0, 1000.0)):
    evs += _device(1, base, 10, 2.0)
    evs += _device(2, base + 3.0, 10, 2.0, stall_at=5 if call == 0 else None, stall=20.0)
  host = [{"ph": "X", "pid": 9, "tid": 1, "ts": 0.0, "dur": 50.0, "name": "cuGraphLaunch"},
          {"ph": "X", "pid": 9, "tid": 2, "ts": 1.0, "dur": 70.0, "name": "cuGraphLaunch"}]
  return meta + evs + host


def test_periods_stalls_and_skew():
  s = graphcheck.trace_stats(_trace(), calls=2)
  g0, g1 = s["devices"]["/device:GPU:0"], s["devices"]["/device:GPU:1"]
  assert g0["our_kernels"] == 20 and g0["executions"] == 2
  assert g0["period_us_median"] == pytest.approx(2.0)
  assert g0["period_us_mean"] == pytest.approx(2.0)
  assert g0["stalls_over_5us"] == 0
  # The stall shows in the mean period and as one gap over 5 us, not in the median.
  assert g1["period_us_median"] == pytest.approx(2.0)
  assert g1["period_us_mean"] == pytest.approx(2.0 + 20.0 / 18)
  assert g1["stalls_over_5us"] == 1
  assert g1["stall_us_max"] == pytest.approx(20.0 + 0.3)
  assert s["start_skew_us"] == pytest.approx([3.0, 3.0])
  assert s["graph_launch_us"] == [50.0, 70.0]
  assert s["host_top"][0] == {"name": "cuGraphLaunch", "count": 2, "total_us": 120.0}


def test_no_kernels_gives_no_devices():
  s = graphcheck.trace_stats([{"ph": "X", "pid": 1, "tid": 1, "ts": 0.0, "dur": 1.0,
                               "name": "other"}], calls=1)
  assert s["devices"] == {} and s["start_skew_us"] == []
