"""The store-atomicity tool's host logic (jax_llar.tools.atomicity): the
link from nvidia-smi's topology matrix, the verdict and the record. The run
itself needs a GPU (tests/gpu1/test_store_atomicity.py)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

from jax_llar.tools import atomicity as sa

ROOT = pathlib.Path(__file__).resolve().parents[1]

TOPO = ("\tGPU0\tGPU1\tGPU2\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
        "GPU0\t X \tNV18\tSYS\tPIX\t0-47\t0\t\tN/A\n"
        "GPU1\tNV18\t X \tSYS\tSYS\t0-47\t0\t\tN/A\n"
        "GPU2\tSYS\tSYS\t X \tSYS\t48-95\t1\t\tN/A\n"
        "\nLegend:\n\n  X    = Self\n  NV#  = Connection traversing a bonded set of # NVLinks\n")
INDICES = "0, 00000000:19:00.0\n1, 00000000:3B:00.0\n2, 00000000:4C:00.0\n"


def test_link_from_the_topology_matrix():
  assert sa.parse_topology(INDICES, TOPO, "0000:19:00.0", "0000:3b:00.0") == "NV18"
  assert sa.parse_topology(INDICES, TOPO, "0000:3B:00.0", "0000:19:00.0") == "NV18"
  assert sa.parse_topology(INDICES, TOPO, "0000:19:00.0", "0000:4c:00.0") == "SYS"
  assert sa.parse_topology(INDICES, TOPO, "0000:4c:00.0", "0000:3b:00.0") == "SYS"
  assert sa.parse_topology(INDICES, TOPO, "0000:99:00.0", "0000:19:00.0") is None
  assert sa.parse_topology(INDICES, "no matrix here", "0000:19:00.0", "0000:3b:00.0") is None
  assert sa.parse_topology("", TOPO, "0000:19:00.0", "0000:3b:00.0") is None


def test_link_from_a_matrix_whose_header_carries_terminal_escapes():
  # As the 2 x H200 machine's nvidia-smi prints it into a pipe (env.log of
  # the 2026-12-01 run): the header underlined with ESC[4m ... ESC[0m. The
  # record of the direction 0 -> 1 said link None before the escapes were
  # dropped.
  topo = ("\t\x1b[4mGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
          "GPU0\t X \tNV18\t0-31\t0\t\tN/A\n"
          "GPU1\tNV18\t X \t0-31\t0\t\tN/A\n")
  indices = "0, 00000000:19:00.0\n1, 00000000:3B:00.0\n"
  assert sa.parse_topology(indices, topo, "0000:19:00.0", "0000:3b:00.0") == "NV18"
  assert sa.parse_topology(indices, topo, "0000:3b:00.0", "0000:19:00.0") == "NV18"


def _native(**kw):
  r = {"same_device": True, "line_rounds": 4096, "rounds_completed": 2, "polls": 5000,
       "torn_lines": 0, "torn_loads": 0, "bad_words": 0, "first_torn": None,
       "cuda_error": None, "timed_out": False, "deadline_exceeded": False,
       "stopped_by_host": False, "seconds": 0.5}
  r.update(kw)
  return r


def test_verdicts():
  assert sa.verdict(_native(), split=False) == ("no torn line", True)
  assert sa.verdict(_native(torn_lines=1, torn_loads=3), split=False) == ("torn lines", False)
  assert sa.verdict(_native(torn_lines=7, torn_loads=9), split=True) == ("detector works", True)
  assert sa.verdict(_native(), split=True) == ("detector failed", False)
  for bad in ({"cuda_error": "cudaErrorX"}, {"timed_out": True}, {"deadline_exceeded": True},
              {"bad_words": 2}, {"line_rounds": 0}):
    for split in (False, True):
      assert sa.verdict(_native(**bad), split=split) == ("error", False), bad


def test_record_says_where_it_ran():
  settings = {"iterations": 2, "lines": 2048, "split": False}
  one = sa.record(_native(), settings, None)
  assert one["over_nvlink"] is False and "not NVLink" in one["note"]
  assert one["link"] == "same device" and one["complete"] and one["passed"]
  assert one["line_rounds"] == 4096 and one["torn_lines"] == 0
  peer = sa.record(_native(same_device=False), settings, "NV18")
  assert peer["over_nvlink"] is True and peer["link"] == "NV18"
  pcie = sa.record(_native(same_device=False), settings, "PIX")
  assert pcie["over_nvlink"] is False
  unknown = sa.record(_native(same_device=False), settings, None)
  assert unknown["over_nvlink"] is None
  partial = sa.record(_native(rounds_completed=1, line_rounds=2048, stopped_by_host=True),
                      settings, None)
  assert not partial["complete"] and partial["passed"]


def test_lines_must_be_whole_warp_stores():
  p = subprocess.run([sys.executable, "-m", "jax_llar.tools.store_atomicity", "--lines=6"],
                     cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert p.returncode == 1 and "multiple of 4" in p.stdout, p.stdout + p.stderr
