"""examples/profile_trace.py on CPU devices: it writes a trace, reads it back
with the profiler's reader and says that no event names jax_llar (every psum
is JAX's on CPU). The GPU suite checks the names (tests/gpu/test_swap.py)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

from cpu_helpers import user_env

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_profile_trace_example_on_cpu(tmp_path):
  out = tmp_path / "found.json"
  p = subprocess.run(
      [sys.executable, str(ROOT / "examples" / "profile_trace.py"), "--cpu_devices", "2",
       "--out", str(tmp_path / "trace"), "--calls", "2", "--json", str(out)],
      env=user_env(), capture_output=True, text=True, timeout=300)
  assert p.returncode == 0, p.stderr[-3000:]
  assert "no event names jax_llar" in p.stdout
  found = json.loads(out.read_text())
  assert found["devices"] == 2 and found["op_names"] == [] and found["kernels"] == []
  assert [(d["reason"], d["candidate"], d["source"]) for d in found["decisions"]] == [
      ("platform", "one_shot_ll", "swap")] * 2
  assert found["xplane"].endswith(".xplane.pb") and found["perfetto"]
  p = subprocess.run(
      [sys.executable, str(ROOT / "examples" / "profile_trace.py"), "--cpu_devices", "2",
       "--sizes", "3"], env=user_env(), capture_output=True, text=True, timeout=300)
  assert p.returncode != 0 and "--sizes" in p.stderr
