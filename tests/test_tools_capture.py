"""jax_llar.tools.capture on evidence with known answers: XLA dump files and
trace events.

The dump tests write GPU dump files in the formats XLA of jax 0.11.2 writes
them (a CPU dump has no command buffers, so the GPU files are built here):
``thunk_sequence*.txt`` as ``SequentialThunk::ToString`` and
``CommandBufferThunk::ToString`` print them (``xla/backends/gpu/runtime``:
``"%03d: "`` thunk id, the kind padded to the longest kind of its sequence,
a tab, then the thunk's own text, which for a command buffer is a newline
and its thunks two levels deeper), ``thunk_metadata.txt`` as the text format
of ``ThunkMetadataListProto`` (``Thunk::ToMetadataProto``: the HLO
instruction's name as ``profile_annotation``), and the optimized HLO in the
text format of a real dump (`test_dump_scan_reads_a_real_cpu_dump` checks
the HLO parser on one that XLA writes on this machine).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from jax_llar.tools import capture
from jax_llar.tools.traces import Event

KERNEL = "void llar::(anonymous namespace)::OneShotLLKernel<float, 2, false>(llar::AllReduceArgs)"
MODULE = "module_1989.jit_body"


def _hlo(n_calls: int = 2, command_buffer: bool = False) -> str:
  """Optimized HLO of the graph child's chain (n_calls psums and multiplies),
  in a real dump's text format; with `command_buffer`, the chain outlined
  into a ``%command_buffer`` computation as XLA's CommandBufferScheduling
  pass writes it."""
  ops, x = [], "%param.1"
  for i in range(n_calls):
    ops.append(f'  %custom-call.{i} = f32[1024]{{0}} custom-call({x}), '
               f'custom_call_target="{capture.TARGET}", '
               'api_version=API_VERSION_TYPED_FFI, backend_config={algorithm = 1 : i64}, '
               'metadata={op_name="jit(body)/llar_psum" stack_frame_id=1}')
    ops.append(f'  %loop_multiply_fusion.{i} = f32[1024]{{0}} fusion(%custom-call.{i}), '
               'kind=kLoop, calls=%fused_multiply')
    x = f"%loop_multiply_fusion.{i}"
  ops[-1] = "  ROOT " + ops[-1].lstrip()
  fused = textwrap.dedent("""\
      %fused_multiply (param_0: f32[1024]) -> f32[1024] {
        %param_0 = f32[1024]{0} parameter(0)
        %constant.1 = f32[] constant(0.25)
        %broadcast.1 = f32[1024]{0} broadcast(%constant.1), dimensions={}
        ROOT %multiply.1 = f32[1024]{0} multiply(%param_0, %broadcast.1)
      }
      """)
  head = ("HloModule jit_body, is_scheduled=true, entry_computation_layout="
          "{(f32[1024]{0})->f32[1024]{0}}\n\n")
  if command_buffer:
    body = "\n".join(["%command_buffer (param.1: f32[1024]) -> f32[1024] {",
                      "  %param.1 = f32[1024]{0} parameter(0)", *ops, "}", "",
                      "ENTRY %main.5 (x.1: f32[1024]) -> f32[1024] {",
                      "  %x.1 = f32[1024]{0} parameter(0)",
                      "  ROOT %call = f32[1024]{0} call(%x.1), to_apply=%command_buffer",
                      "}"])
  else:
    body = "\n".join(["ENTRY %main.5 (param.1: f32[1024]) -> f32[1024] {",
                      "  %param.1 = f32[1024]{0} parameter(0)", *ops, "}"])
  return head + fused + "\n" + body + "\n"


def _sequence(thunks, indent: int = 0) -> str:
  """SequentialThunk::ToString(indent) of [(id, kind, nested or None)]."""
  pad = " " * (2 * indent)
  width = max(len(k) for _, k, _ in thunks)
  out = ""
  for tid, kind, nested in thunks:
    own = "" if nested is None else "\n" + _sequence(nested, indent + 2)
    out += f"{pad}{tid:03d}: {kind}{' ' * (width - len(kind))}\t{own}\n"
  return out


def _chain_thunks(n_calls: int = 2):
  """Thunk ids of the chain: custom call 2i+1, multiply kernel 2i+2."""
  out = []
  for i in range(n_calls):
    out += [(2 * i + 1, "kCustomCall", None), (2 * i + 2, "kKernel", None)]
  return out


def _metadata(n_calls: int = 2, command_buffer_id: int | None = None) -> str:
  entries = []
  if command_buffer_id is not None:
    entries.append((command_buffer_id, "kCommandBuffer", ""))
  for i in range(n_calls):
    entries += [(2 * i + 1, "kCustomCall", f"custom-call.{i}"),
                (2 * i + 2, "kKernel", f"loop_multiply_fusion.{i}")]
  text = ""
  for tid, kind, ann in entries:
    info = (f'    profile_annotation: "{ann}"\n' if ann else "") + f"    thunk_id: {tid}\n"
    text += f"thunk_metadata {{\n  thunk_info {{\n{info}  }}\n  thunk_kind: \"{kind}\"\n}}\n"
  return text


def _write(tmp_path, **files):
  for suffix, text in files.items():
    name = {"hlo": "sm_9.0a_gpu_after_optimizations.txt",
            "thunks": "thunk_sequence.txt",
            "after_passes": "thunk_sequence_after_thunk_passes.txt",
            "metadata": "thunk_metadata.txt"}[suffix]
    (tmp_path / f"{MODULE}.{name}").write_text(text)
  # Files of the dump that the scan only lists.
  (tmp_path / f"{MODULE}.before_optimizations.txt").write_text(
      f'custom-call(...), custom_call_target="{capture.TARGET}"\n')
  (tmp_path / "module_0001.jit_convert_element_type.thunk_sequence.txt").write_text(
      _sequence([(0, "kKernel", None)]))


def test_thunk_sequence_format():
  text = _sequence([(5, "kCommandBuffer", _chain_thunks(1)), (9, "kCopy", None)])
  assert text == ("005: kCommandBuffer\t\n"
                  "    001: kCustomCall\t\n    002: kKernel    \t\n\n"
                  "009: kCopy         \t\n")
  got = capture.parse_thunk_sequence(text)
  assert [(t["id"], t["kind"], t["in_command_buffer"]) for t in got] == [
      (5, "kCommandBuffer", False), (1, "kCustomCall", True), (2, "kKernel", True),
      (9, "kCopy", False)]


def test_dump_scan_finds_the_call_inside_a_command_buffer_on_thunks(tmp_path):
  """XLA of jax 0.11.2: command buffers formed on thunks."""
  _write(tmp_path, hlo=_hlo(),
         thunks=_sequence(_chain_thunks()),
         after_passes=_sequence([(5, "kCommandBuffer", _chain_thunks())]),
         metadata=_metadata(command_buffer_id=5))
  d = capture.scan_dump(str(tmp_path))
  assert d["decided"] is True and d["in_command_buffer"] is True, d
  assert d["source"] == "thunk sequence + thunk metadata"
  m = d["modules"]["module_1989"]
  assert m["custom_calls"] == ["custom-call.0", "custom-call.1"]
  assert m["thunks_of_the_call"] == 2 and m["thunks_in_command_buffer"] == 2
  assert m["thunk_file"] == f"{MODULE}.thunk_sequence_after_thunk_passes.txt"
  assert f"{MODULE}.before_optimizations.txt" in d["files_mentioning_target"]


def test_dump_scan_call_outside_the_command_buffer(tmp_path):
  """The multiplies captured, the custom calls left between them; and no
  command buffer at all (no after-passes file: the passes changed nothing)."""
  after = _sequence([(1, "kCustomCall", None), (5, "kCommandBuffer", [(2, "kKernel", None)]),
                     (3, "kCustomCall", None), (6, "kCommandBuffer", [(4, "kKernel", None)])])
  _write(tmp_path, hlo=_hlo(), after_passes=after, metadata=_metadata())
  d = capture.scan_dump(str(tmp_path))
  assert d["decided"] is True and d["in_command_buffer"] is False, d
  assert d["modules"]["module_1989"]["thunks_in_command_buffer"] == 0

  os.remove(tmp_path / f"{MODULE}.thunk_sequence_after_thunk_passes.txt")
  _write(tmp_path, thunks=_sequence(_chain_thunks()))
  d = capture.scan_dump(str(tmp_path))
  assert d["decided"] is True and d["in_command_buffer"] is False, d
  assert d["modules"]["module_1989"]["thunk_file"] == f"{MODULE}.thunk_sequence.txt"


def test_dump_scan_one_call_of_two_inside(tmp_path):
  after = _sequence([(5, "kCommandBuffer", _chain_thunks(1)), (3, "kCustomCall", None),
                     (4, "kKernel", None)])
  _write(tmp_path, hlo=_hlo(), after_passes=after, metadata=_metadata())
  d = capture.scan_dump(str(tmp_path))
  assert d["decided"] is True and d["in_command_buffer"] is False
  assert d["modules"]["module_1989"]["thunks_in_command_buffer"] == 1


def test_dump_scan_without_metadata_uses_the_custom_call_thunks(tmp_path):
  _write(tmp_path, hlo=_hlo(),
         after_passes=_sequence([(5, "kCommandBuffer", _chain_thunks())]))
  d = capture.scan_dump(str(tmp_path))
  assert d["decided"] is True and d["in_command_buffer"] is True
  assert d["source"] == "thunk sequence (every kCustomCall thunk of the module)"
  # Older XLA: no thunk ids, the instruction's name after the kind.
  (tmp_path / f"{MODULE}.thunk_sequence_after_thunk_passes.txt").write_text(
      "kCommandBuffer\t\n    kCustomCall\tcustom-call.0\n    kKernel    \tloop_multiply_fusion.0\n\n"
      "kCustomCall   \tcustom-call.1\nkKernel       \tloop_multiply_fusion.1\n")
  d = capture.scan_dump(str(tmp_path))
  assert d["source"] == "thunk sequence (instruction names on the thunk lines)"
  assert d["decided"] is True and d["in_command_buffer"] is False
  assert d["modules"]["module_1989"]["thunks_in_command_buffer"] == 1


def test_dump_scan_finds_the_call_in_an_hlo_command_buffer(tmp_path):
  """Older XLA: CommandBufferScheduling outlines the chain in HLO."""
  _write(tmp_path, hlo=_hlo(command_buffer=True))
  d = capture.scan_dump(str(tmp_path))
  assert d["decided"] is True and d["in_command_buffer"] is True, d
  assert d["source"] == "hlo command_buffer computation"
  assert d["modules"]["module_1989"]["hlo_command_buffers"] == ["command_buffer"]


def test_dump_scan_undecided(tmp_path):
  """The HLO calls the target but no thunk dump exists; or nothing calls it."""
  _write(tmp_path, hlo=_hlo())
  d = capture.scan_dump(str(tmp_path))
  assert d["decided"] is False and d["source"] == "no thunk sequence dump"
  assert capture.scan_dump(str(tmp_path), "other_target")["source"] == (
      "no optimized HLO calls the target")


def test_dump_scan_reads_a_real_cpu_dump(tmp_path):
  """A dump XLA writes here (CPU: no thunk sequence, no command buffers),
  scanned for a custom call XLA's CPU backend emits (LAPACK's getrf): the
  optimized HLO's file name and custom-call lines parse."""
  program = textwrap.dedent("""\
      import jax, jax.numpy as jnp
      f = jax.jit(lambda x: jax.scipy.linalg.lu_factor(x)[0] * 0.5)
      print(f(jnp.eye(4) * 2.0).shape)
      """)
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_dump_to={tmp_path}")
  r = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True,
                     text=True, timeout=300, check=False)
  assert r.returncode == 0, r.stderr[-2000:]
  target = "lapack_sgetrf_ffi"
  d = capture.scan_dump(str(tmp_path), target)
  (module,) = d["modules"].values()
  assert module["hlo_file"].endswith("cpu_after_optimizations.txt")
  assert len(module["custom_calls"]) == 1 and module["hlo_command_buffers"] == []
  assert d["decided"] is False and d["source"] == "no thunk sequence dump"


def test_targets_name_the_child_implementations():
  from jax_llar.tools import copy  # pylint: disable=g-import-not-at-top
  from jax_llar.tools.loopback import group as loopback_group  # pylint: disable=g-import-not-at-top
  assert capture.TARGETS == {"llar": capture.TARGET, "copy": copy.TARGET_COPY,
                             "loopback": loopback_group.TARGET_ALL_REDUCE}


def test_verdict_names_its_evidence():
  dump_yes = {"decided": True, "in_command_buffer": True, "source": "thunk sequence"}
  dump_none = {"decided": False, "in_command_buffer": False, "source": "no thunk sequence dump"}
  trace_yes = {"trace_found": True, "captured": True}
  trace_no = {"trace_found": True, "captured": False}
  v = capture.decide(dump_yes, trace_no)
  assert v == {"in_command_buffer": True, "evidence": "dump: thunk sequence",
               "evidence_agree": False}
  v = capture.decide(dump_none, trace_yes)
  assert v["in_command_buffer"] is True and v["evidence"].startswith("trace")
  assert v["evidence_agree"] is None
  v = capture.decide(dump_none, {"trace_found": False})
  assert v["in_command_buffer"] is False and v["evidence"].startswith("none")


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
