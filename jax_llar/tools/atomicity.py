"""The store-atomicity test's host logic: the link between two GPUs, the
verdict and the result record of a run of the native test
(``jax_llar.tools._llar_tools.store_atomicity``; ``ffi/tools/store_atomicity.h``
in the repository). The command line is `jax_llar.tools.store_atomicity`,
which says what the test does.
"""

from __future__ import annotations

import re
import subprocess
from typing import Any

SAME_DEVICE_PATH = "one device: L2 only, not NVLink (every access is local)"
PEER_PATH = "two devices: the writer stores into the reader's memory over the peer path"


def _bus_key(bus_id: str) -> tuple[int, int, str] | None:
  """(domain, bus, device.function) of a PCI bus id as CUDA or nvidia-smi
  spell it ("0000:19:00.0", "00000000:19:00.0"), or None."""
  parts = bus_id.strip().lower().split(":")
  if len(parts) != 3:
    return None
  try:
    return int(parts[0], 16), int(parts[1], 16), parts[2]
  except ValueError:
    return None


def parse_topology(indices_csv: str, topo: str, bus_a: str, bus_b: str) -> str | None:
  """The link between the GPUs with PCI bus ids `bus_a` and `bus_b` in the
  matrix of ``nvidia-smi topo -m`` (`topo`), given the index-to-bus table of
  ``nvidia-smi --query-gpu=index,pci.bus_id --format=csv,noheader``
  (`indices_csv`); e.g. "NV18", "SYS", "PIX". None when either GPU or the
  matrix cell is not found."""
  index = {}
  for row in indices_csv.strip().splitlines():
    cells = [c.strip() for c in row.split(",")]
    if len(cells) == 2 and cells[0].isdigit():
      key = _bus_key(cells[1])
      if key is not None:
        index[key] = int(cells[0])
  a, b = index.get(_bus_key(bus_a)), index.get(_bus_key(bus_b))
  if a is None or b is None:
    return None
  # nvidia-smi underlines the header with terminal escapes (ESC[4m ... ESC[0m)
  # on some drivers, even into a pipe: drop them, or the header is not found.
  topo = re.sub(r"\x1b\[[0-9;]*m", "", topo)
  lines = [ln.split() for ln in topo.splitlines() if ln.strip()]
  # The header is the first line that starts with GPU0 (the rows follow it).
  top = next((i for i, cells in enumerate(lines) if cells[0] == "GPU0"), None)
  if top is None:
    return None
  columns = [c for c in lines[top] if c.startswith("GPU")]
  want = f"GPU{b}"
  if want not in columns:
    return None
  for cells in lines[top + 1:]:
    if cells[0] == f"GPU{a}" and len(cells) > columns.index(want) + 1:
      return cells[1 + columns.index(want)]
  return None


def link_between(bus_a: str, bus_b: str) -> str | None:
  """The nvidia-smi topology entry between two GPUs given by PCI bus id, or
  None when nvidia-smi is missing or does not say."""
  try:
    q = subprocess.run(["nvidia-smi", "--query-gpu=index,pci.bus_id",
                        "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
    t = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True,
                       timeout=30)
  except (OSError, subprocess.SubprocessError):
    return None
  if q.returncode or t.returncode:
    return None
  return parse_topology(q.stdout, t.stdout, bus_a, bus_b)


def verdict(r: dict[str, Any], split: bool) -> tuple[str, bool]:
  """(verdict, passed) of a native result `r`.

  A run with a CUDA error, a timed-out wait, kernels still running at the
  host deadline, bad words (values no round wrote: a bug of the test) or no
  round checked is an "error". Otherwise, without `split`: "no torn line"
  passes and "torn lines" fails; with `split` (the writer tears lines on
  purpose): "detector works" passes when torn lines were found, "detector
  failed" fails when none were.
  """
  if (r.get("cuda_error") or r.get("timed_out") or r.get("deadline_exceeded")
      or r.get("bad_words") or not r.get("line_rounds")):
    return "error", False
  torn = r["torn_lines"] > 0
  if split:
    return ("detector works", True) if torn else ("detector failed", False)
  return ("torn lines", False) if torn else ("no torn line", True)


def record(r: dict[str, Any], settings: dict[str, Any], link: str | None) -> dict[str, Any]:
  """The result record of one run: the settings, what was checked and found,
  where it ran (over_nvlink: True/False, None when unknown) and the verdict."""
  same = bool(r["same_device"])
  name, passed = verdict(r, settings["split"])
  over_nvlink = False if same else (None if link is None else link.startswith("NV"))
  out = {
      "level": "store_atomicity",
      "note": SAME_DEVICE_PATH if same else PEER_PATH,
      "over_nvlink": over_nvlink,
      "link": "same device" if same else link,
      "settings": settings,
      "iterations": settings["iterations"],
      "lines": settings["lines"],
      "rounds_completed": r["rounds_completed"],
      "line_rounds": r["line_rounds"],
      "torn_lines": r["torn_lines"],
      "torn_loads": r["torn_loads"],
      "bad_words": r["bad_words"],
      "polls": r["polls"],
      "first_torn": r["first_torn"],
      "complete": r["rounds_completed"] >= settings["iterations"],
      "verdict": name,
      "passed": passed,
  }
  out["native"] = {k: v for k, v in r.items() if k not in out}
  if r["line_rounds"]:
    out["ns_per_round"] = r["seconds"] * 1e9 / max(1, r["rounds_completed"])
  return out
