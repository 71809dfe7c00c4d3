"""jax_llar.tools.capture on synthetic evidence: XLA dump files and trace
events with known answers."""

from __future__ import annotations

from jax_llar.tools import capture
from jax_llar.tools.traces import Event

KERNEL = "void llar::(anonymous namespace)::OneShotLLKernel<float, 2, false>(llar::AllReduceArgs)"


def test_dump_scan_finds_the_call_inside_a_command_buffer(tmp_path):
  (tmp_path / "module_0001.jit_body.thunk_sequence.txt").write_text(
      "kCommandBuffer command_buffer_1\n  kFusion loop_multiply_fusion\n"
      f"  kCustomCall {capture.TARGET} custom-call.3\n")
  (tmp_path / "module_0001.jit_body.before_optimizations.txt").write_text(
      f"custom-call(...), custom_call_target=\"{capture.TARGET}\"\n")
  (tmp_path / "unrelated.txt").write_text("nothing\n")
  d = capture.scan_dump(str(tmp_path))
  assert d["in_command_buffer"] is True
  assert sorted(d["files_mentioning_target"]) == [
      "module_0001.jit_body.before_optimizations.txt",
      "module_0001.jit_body.thunk_sequence.txt"]
  assert d["evidence"][0]["command_buffer_lines_above"] == ["kCommandBuffer command_buffer_1"]


def test_dump_scan_without_command_buffer(tmp_path):
  (tmp_path / "m.thunk_sequence.txt").write_text(f"kCustomCall {capture.TARGET}\n")
  assert capture.scan_dump(str(tmp_path))["in_command_buffer"] is False


def _events(host_launches: int) -> list[Event]:
  evs = []
  for dev in ("/device:GPU:0", "/device:GPU:1"):
    for i in range(64):
      evs.append(Event(dev, "Stream #24(Compute)", KERNEL, 10.0 * i, 2.0))
      evs.append(Event(dev, "Stream #24(Compute)", "loop_multiply_fusion", 10.0 * i + 3, 1.0))
  evs += [Event("/host:CPU", "py_xla_execute/1", "command_buffer::execute", 0.0, 5.0),
          Event("/host:CPU", "py_xla_execute/1", "cuGraphLaunch (CudaGraph:4)", 1.0, 3.0)]
  evs += [Event("/host:CPU", "py_xla_execute/1", "cuLaunchKernel", 2.0, 1.0)] * host_launches
  return evs


def test_trace_scan_counts_a_captured_chain():
  s = capture.scan_events(_events(host_launches=0))
  assert s["our_kernel_runs"] == 128 and s["graph_launches"] == 1
  assert s["command_buffer_events"] == 1 and s["host_kernel_launches"] == 0
  assert s["captured"] is True
  assert s["kernel_processes"] == ["/device:GPU:0", "/device:GPU:1"]
  assert set(s["timeline"]) == {"/device:GPU:0", "/device:GPU:1"}


def test_trace_scan_host_launches_mean_not_captured():
  assert capture.scan_events(_events(host_launches=64))["captured"] is False
