"""examples/tp_decode on CPU, as a new user runs it from the repository root:
no traceback, the token ids of lax.psum and jax_llar.psum agree, and --json
writes a result in the result-file shape."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_tp_decode_small_on_cpu(tmp_path):
  env = dict(os.environ)
  env.pop("JAX_PLATFORMS", None)  # the example sets it itself without a GPU
  env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split()
                              if "xla_force_host_platform_device_count" not in f)
  out = tmp_path / "demo.json"
  p = subprocess.run(
      [sys.executable, "examples/tp_decode/main.py", "--preset=small", "--tokens=3",
       "--repeats=1", f"--json={out}"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
  assert "Traceback" not in p.stdout + p.stderr, p.stderr[-3000:]
  assert "tokens agree: True" in p.stdout
  result = json.loads(out.read_text())
  assert result["level"] == "app" and isinstance(result["env"], dict)
  assert result["demo"]["tokens_agree"] is True
  assert len(result["demo"]["token_ids"]) == 3  # the tokens of the first sequence
  rows = result["rows"]
  assert [r["impl"] for r in rows] == ["lax.psum", "llar.auto"]
  for r in rows:
    assert {"impl", "world_size", "dtype", "metric", "value"} <= set(r), r
    assert r["metric"] == "itl_us" and r["value"] > 0 and r["world_size"] == 2
