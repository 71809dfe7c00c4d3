"""Creating a communicator set whose group spans processes is bounded and
releases what it made (issue 13: one process per GPU), on one GPU.

The native ``create_comm_set_of_ranks`` runs in a child process
(programs/spanning_setup.py) as the rank-0 process of a 2-rank group whose
rank 1 never joins, or joins from a second process on the same GPU (which
NCCL refuses). Either way the creation must end in an error naming the
step, within the bound, and leave nothing of NCCL's running: the
communicators are aborted, so the set-up thread NCCL started is gone.
"""

from __future__ import annotations

import json
import subprocess
import sys

from loopback_helpers import ROOT

PROGRAM = ROOT / "tests" / "gpu1" / "programs" / "spanning_setup.py"

# What the bound may be exceeded by: NCCL's abort (it joins NCCL's set-up
# thread) and the first communicator's one-time initialisation.
SLACK_S = 20


def run_program(*args: str, timeout: float) -> dict:
  """Runs the child program; returns its JSON line (asserting it printed one
  and that the extension loaded)."""
  p = subprocess.run([sys.executable, str(PROGRAM), *args], cwd=ROOT, capture_output=True,
                     text=True, timeout=timeout)
  tail = (p.stdout + p.stderr)[-4000:]
  line = next((ln for ln in reversed(p.stdout.splitlines()) if ln.startswith("{")), None)
  assert p.returncode == 0 and line is not None, tail
  data = json.loads(line)
  assert "unavailable" not in data, data
  return data


def test_f10_a_peer_that_never_joins_ends_in_the_step_error_within_the_bound():
  """Three attempts, each with a fresh unique id and a 2 s bound: each raises
  "ncclCommInitRank did not complete within 2000 ms for rank 0 of 2 (CUDA
  device D): ..." after the bound and before the bound plus SLACK_S; each
  leaves at most one thread behind (NCCL's bootstrap root of that unique
  id, which waits for rank 1 for the life of the process; the set-up thread
  of the aborted communicator is joined); and device memory does not grow
  from the first attempt to the last by more than 16 MiB (the first one
  includes NCCL's one-time initialisation)."""
  setup_ms, attempts = 2000, 3
  data = run_program("absent", str(setup_ms), str(attempts),
                     timeout=attempts * (setup_ms / 1000 + SLACK_S) + 120)
  rows = data["attempts"]
  assert len(rows) == attempts, data
  for row in rows:
    assert row["error"] is not None, data
    assert f"ncclCommInitRank did not complete within {setup_ms} ms for rank 0 of 2" in row[
        "error"], row
    assert "a process of the group may have died or not reached this step" in row["error"], row
    assert "aborted its communicators" in row["error"], row
    assert setup_ms / 1000 <= row["seconds"] < setup_ms / 1000 + SLACK_S, row
  # The same error every time: NCCL still works after the aborts.
  assert len({r["error"].split("(CUDA device")[0] for r in rows}) == 1, rows
  assert rows[-1]["threads"] - rows[0]["threads"] <= attempts - 1, data
  assert rows[-1]["used_mib"] - rows[0]["used_mib"] <= 16, data


def test_f10_a_peer_nccl_refuses_ends_in_an_error_in_both_processes():
  """Rank 1 joins from a second process on the same GPU: NCCL refuses two
  ranks on one device after its first exchange, and both processes end in
  an error of the ncclCommInitRank step (NCCL's "invalid usage", or the
  bound if the peer could not start in time), each within its bound plus
  SLACK_S."""
  setup_ms = 60_000
  data = run_program("same_gpu", str(setup_ms), timeout=2 * (setup_ms / 1000 + SLACK_S) + 120)
  (mine,) = data["attempts"]
  assert "attempts" in data["peer"], data["peer"]
  (peer,) = data["peer"]["attempts"]
  for rank, row in ((0, mine), (1, peer)):
    assert row["error"] is not None, data
    assert f"ncclCommInitRank failed for rank {rank} of 2" in row["error"] or (
        f"ncclCommInitRank did not complete within {setup_ms} ms for rank {rank} of 2"
        in row["error"]), row
    assert row["seconds"] < setup_ms / 1000 + SLACK_S, row
