"""Running the loopback tool from the one-GPU tests (in a child process: a
failed case may lose its CUDA context)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

from jax_llar.tools.loopback_harness import MAX_CONNECTIONS, summary

ROOT = pathlib.Path(__file__).resolve().parents[2]


def statuses(record) -> dict[str, int]:
  """Rows per status of a record."""
  return summary(record["rows"])


def run_tool(tmp_path, *args, timeout=900):
  """Runs ``python -m jax_llar.tools.loopback`` with `args`; returns (exit
  status, its JSON record or None, the tail of its output)."""
  path = tmp_path / "loopback.json"
  env = dict(os.environ)
  env.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", MAX_CONNECTIONS)
  p = subprocess.run([sys.executable, "-m", "jax_llar.tools.loopback", f"--json={path}",
                      *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                     env=env)
  tail = (p.stdout + p.stderr)[-4000:]
  record = json.loads(path.read_text()) if path.exists() else None
  return p.returncode, record, tail
