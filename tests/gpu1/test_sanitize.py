"""compute-sanitizer over a cross-section of the kernels, on one GPU:
``python -m jax_llar.tools.sanitize --matrix=small`` in a child process,
after the background's fault children (background.py).

Every one-GPU run keeps the kernels clean under all four tools (memcheck,
racecheck, synccheck, initcheck): the fused all-reduce + add + RMSNorm with
a one-block row (1 x 64, the launch shape whose cluster operations the
sanitizer once reported as invalid) and a multi-block row cluster (2 x 2048),
with both weight dtypes; the one-shot LL at an odd size, a block edge and
past the 64-block rule; the two-shot LL128 at one element, a line edge and
several chunks; and a rank left out of a call under memcheck, whose trap
is expected (the unit passes when its report is the bounded wait's and the
sanitizer reports no defect beside it). The 12 clean runs start at once
(sanitize.SMALL_JOBS), without the tool's probe of the extension (this
suite's skip reason has loaded it). The whole matrix, its fault units under
synccheck too, is the sanitize stage's (``scripts/gpu_run.sh sanitize``).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from jax_llar.tools.sanitize import harness as sanitize

from loopback_helpers import ROOT


def test_the_cross_section_is_clean_under_every_tool(background, tmp_path):
  """Runs once no fault child of the background runs (background.py): a
  sanitized unit beside other GPU work slowed that work several times
  over, and its fault unit traps."""
  if sanitize.find_sanitizer() is None:
    pytest.skip("compute-sanitizer is not installed (CUDA toolkit)")
  if background is not None:
    background.faults_done()
  path = tmp_path / "sanitize.json"
  p = subprocess.run([sys.executable, "-m", "jax_llar.tools.sanitize", "--matrix=small",
                      f"--jobs={sanitize.SMALL_JOBS}", "--noprobe", f"--json={path}"],
                     cwd=ROOT, capture_output=True, text=True, timeout=900)
  tail = (p.stdout + p.stderr)[-6000:]
  assert path.exists(), tail
  rows = json.loads(path.read_text())["rows"]
  got = {(r["tool"], r["unit"]): r for r in rows}
  assert set(got) == {(t, u.name) for u in sanitize.SMALL for t in sanitize.TOOLS
                      if not u.tools or t in u.tools}, tail
  for (tool, unit), r in got.items():
    assert r["status"] == "pass", (tool, unit, r.get("why"), r.get("tail", "")[-2000:])
    assert r["defects"] == 0, r
    if not r["fault"]:
      assert r["sanitizer_errors"] == 0 and not r["reports"], r
  # W=2: float32, bfloat16 with a bfloat16 weight and with a float32 one,
  # each at 1 x 64 and 2 x 2048.
  assert all(got[(t, "add_rms_norm")]["cases"] == {"pass": 6} for t in sanitize.TOOLS)
  assert p.returncode == 0, tail
