"""The store-atomicity test of 128-byte warp stores (``python -m
jax_llar.tools.store_atomicity``) on one GPU, in a child process.

On one device the writer and the reader share the L2: this checks the
property LL128 rests on for that path, not NVLink (the record says so). The
split mode, where the writer stores each line in two instructions with the
flag's half first, shows that the detector finds torn lines when they
exist, so a clean run is evidence and not a check that cannot fail.
"""

from __future__ import annotations

import json
import subprocess
import sys

from loopback_helpers import ROOT


def run_tool(tmp_path, *args, timeout=600):
  """Runs the tool with `args`; returns (exit status, its record, output tail)."""
  path = tmp_path / "store_atomicity.json"
  p = subprocess.run([sys.executable, "-m", "jax_llar.tools.store_atomicity", f"--out={path}",
                      *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
  tail = (p.stdout + p.stderr)[-4000:]
  record = json.loads(path.read_text()) if path.exists() else None
  return p.returncode, record, tail


def test_no_torn_line_on_one_device(tmp_path):
  """100,000 rounds of 2,048 lines: every line checked every round, none
  torn; the record says the path is L2, not NVLink."""
  rc, record, tail = run_tool(tmp_path, "--iterations=100000", "--lines=2048",
                              "--max_seconds=120")
  assert record is not None, tail
  assert rc == 0, tail
  assert record["verdict"] == "no torn line" and record["passed"], tail
  assert record["torn_lines"] == 0 and record["torn_loads"] == 0 and record["bad_words"] == 0
  assert record["complete"] and record["rounds_completed"] == 100000, tail
  assert record["line_rounds"] == 100000 * 2048
  assert record["polls"] >= record["line_rounds"] // 4  # at least one warp load per group
  assert record["over_nvlink"] is False and "not NVLink" in record["note"]
  assert record["first_torn"] is None


def test_split_stores_are_detected(tmp_path):
  """The writer tears every line on purpose (flag half first, the other half
  2 microseconds later): the detector must report torn lines, and the
  first torn load it quotes carries the current round in its flag word and
  an older one in a word of the late half."""
  rc, record, tail = run_tool(tmp_path, "--split", "--iterations=2000", "--lines=256",
                              "--split_delay_ns=2000", "--max_delay_ns=0")
  assert record is not None, tail
  assert rc == 0, tail
  assert record["verdict"] == "detector works" and record["passed"], tail
  assert record["torn_lines"] > 0 and record["torn_loads"] >= record["torn_lines"]
  assert record["bad_words"] == 0
  t = record["first_torn"]
  rounds = [w >> 32 for w in t["words"]]
  assert rounds[15] == t["round"], t  # the flag word: lane 7's second 8 bytes
  assert min(rounds[:8]) < t["round"], t  # lanes 0-3 (words 0-7) came later
