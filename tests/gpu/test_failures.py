"""Failure classes that need a process of their own: concurrency (F5), epoch
wrap-around (F4), memory after many executables, after a set is destroyed and
after a set is given up (F11), rank divergence (F12) and a dropped peer write
(F13).

Each runs a child program (tests/gpu/programs/) that prints one JSON object:
a mispaired call or a trap poisons the CUDA context of the process that ran
it, not the test process.
"""

from __future__ import annotations

from gpu_helpers import run_program


def _report_of(reports, rank, peer):
  return [r for r in reports if r.get("rank") == rank and r.get("peer") == peer]


def test_f5_two_threads_dispatching():
  """Two Python threads dispatch jitted programs on the same devices."""
  p = run_program("two_threads", env={"JAX_LLAR_TIMEOUT_MS": "3000"})
  assert p.data is not None, p.tail
  assert p.data["fast"] is True, p.tail  # the threads raced on the fast path
  assert p.data["hung"] is False and p.data["errors"] == [], p.tail


def test_f4_epoch_wraparound():
  """Epoch counters seeded just below 2^16, 2^30, 2^31 and 2^32 (test hook);
  crossing them re-zeroes scratch halves and wraps the LL flags' 16 epoch
  bits."""
  p = run_program("epoch_wraparound", env={"JAX_LLAR_TIMEOUT_MS": "3000"})
  assert p.data is not None, p.tail
  assert p.data["fast"] is True and p.data["ok"] is True, p.tail


def test_f12_rank_divergence_fails_with_report():
  """A rank-dependent number of calls fails with a report, not a hang."""
  p = run_program("rank_divergence", env={"JAX_LLAR_TIMEOUT_MS": "1500"})
  assert p.data is not None, p.tail
  assert p.data["error"] is not None, p.tail
  # Rank 0 (the only caller) waited for rank 1 and reported it, with the epoch.
  mine = _report_of(p.data["reports"], rank=0, peer=1)
  assert mine and all("epoch" in r for r in mine), p.data["reports"]


def test_f13_dropped_peer_write_fails_with_report():
  """A dropped peer write (test hook) fails the call with rank/slot/epoch."""
  p = run_program("fault_modes", "drop_peer_writes", env={"JAX_LLAR_TIMEOUT_MS": "1500"})
  assert p.data is not None, p.tail
  assert p.data["fast_before"], p.tail
  assert p.data["error"] is not None, p.tail
  assert _report_of(p.data["reports"], rank=0, peer=1), p.data["reports"]


def test_f11_memory_returns_to_its_baseline():
  """F11: 90 programs of many shapes (two algorithms and the fused op)
  compiled, run and dropped in three rounds with jax.clear_caches(): device
  memory per GPU ends within 8 MiB of the baseline taken after a warm-up
  round, and the communicator sets and their scratch do not change."""
  p = run_program("memory_baseline", env={"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"})
  assert p.data is not None, p.tail
  assert p.data["fast"] is True, p.tail
  base = p.data["baseline_mib"]
  for used in p.data["rounds_mib"]:
    assert all(u - b <= 8.0 for u, b in zip(used, base)), (base, p.data["rounds_mib"])
  assert p.data["scratch_after"] == p.data["scratch"], p.tail
  assert p.data["comm_sets"] == 1, p.tail
  # The regions of both algorithms are held, and nothing else.
  (_, regions, _), = p.data["scratch"]
  assert sorted(regions) == ["one_shot_ll", "two_shot_ll"], regions


def test_f11_a_set_destroyed_before_use_returns_its_memory():
  """F11: a communicator set without regions, destroyed (what a process
  does with a set the other processes refused, jax_llar.distributed), gives
  its device memory back: after each of 4 sets made and destroyed, memory
  per GPU is within 16 MiB of the baseline taken after a warm-up set, while
  4 sets kept hold at least 2 MiB more per GPU than the baseline; a set
  holding a region is refused and keeps it; a destroyed id is gone for good
  and never reused; a psum afterwards is right, on the fast path."""
  p = run_program("comm_set_release")
  assert p.data is not None and p.rc == 0, p.tail
  d = p.data
  base = d["baseline_mib"]
  for c in d["cycles"]:
    assert all(u - b <= 16.0 for u, b in zip(c["destroyed_mib"], base)), d
  # The test can see a set: 4 kept sets hold memory on both GPUs of the group.
  assert all(u - b >= 2.0 for u, b in zip(d["kept_mib"][-1][:2], base[:2])), d
  assert d["refusal"] is not None and "holds the one_shot_ll scratch region" in d["refusal"], d
  assert d["region_set"]["comm_key"] and d["region_set"]["scratch_bytes"] > 0, d
  assert len(d["region_set"]["regions"]) == 1, d
  gone = d["destroyed"]
  assert (gone["comm_key"], gone["regions"], gone["scratch_bytes"]) == (0, [], 0), d
  assert gone["ensure_region"] is not None and "was destroyed" in gone["ensure_region"], d
  assert gone["second_destroy"] is None, d
  ids = [c["id"] for c in d["cycles"]]
  assert len(set(ids)) == len(ids) and d["next_id"] > max(ids + [d["held_id"]]), d
  assert d["psum_ok"] and d["fast"], d


def test_f11_a_set_given_up_after_use_keeps_its_memory():
  """F11: a set whose later registration fails (test hook: the step fails
  once complete, as when the bound passes just as NCCL completes it) is
  given up but keeps its communicators and memory, because a program
  compiled before holds its one-shot region (registry.h: EnsureRegion):
  that program's graph, replayed afterwards, still sums right (an abort
  would have unmapped the peers' memory under it: an illegal address), and
  once its peer sends nothing it ends in the bounded-wait error with a
  report; new lowerings fall back to lax.psum."""
  p = run_program("set_given_up", env={"JAX_LLAR_TIMEOUT_MS": "1500",
                                       "XLA_FLAGS": "--xla_gpu_graph_min_graph_size=1"})
  assert p.data is not None, p.tail
  d = p.data
  assert d["fast_before"] and d["before_ok"] == [True] * 3, d
  assert d["given_up"] is not None, d
  assert "made to fail after it completed" in d["given_up"], d["given_up"]
  assert "its communicators and memory kept" in d["given_up"], d["given_up"]
  assert d["regions_before"] == ["one_shot_ll"] and d["regions_after"] == [], d
  # Nothing freed, and the failed two-shot region, kept for good, counts.
  assert d["scratch_after"] == d["scratch_before"] + d["two_shot_bytes"], d
  assert d["scratch_before"] > 0 and d["two_shot_bytes"] > 0, d
  fb = d["fallback"]
  assert fb is not None and not fb["fast"] and fb["reason"] == "communicator", d
  assert "gave up communicator set" in fb["detail"], fb
  replay = d["replay"]
  assert not (replay["error"] and "no one_shot_ll scratch region" in replay["error"]["message"]), (
      "XLA called the handler again instead of replaying the captured graph, so this "
      f"run cannot show what the graph's kernels reach: {replay}")
  assert replay["error"] is None and replay["ok"] is True, replay
  assert replay["reports"] == [], replay
  gone = d["gone"]
  assert gone["error"] is not None and gone["ok"] is None, gone
  assert "illegal" not in gone["error"]["message"].lower(), gone
  assert _report_of(gone["reports"], rank=0, peer=1), gone["reports"]


# --- issue 12, item 5: fault injection (hooks.h, set_fault_for_testing) ---------------


def test_f13_corrupted_flag_fails_with_report():
  """Line 0 of the second device's sends carries a flag with a flipped epoch
  bit: no reader may take it, so the call ends in the bounded-wait error with
  a report naming that device's rank, never in a sum."""
  p = run_program("fault_modes", "corrupt_flag", env={"JAX_LLAR_TIMEOUT_MS": "1500"})
  assert p.data is not None, p.tail
  assert p.data["fast_before"] and p.data["correct"] is None, p.tail
  assert p.data["error"] is not None, p.tail
  assert _report_of(p.data["reports"], rank=0, peer=1), p.data["reports"]


def test_f12_rank_delayed_by_100_ms_still_sums_correctly():
  """The second device sends 100 ms late (a bounded spin): with a timeout
  above the delay the peers wait it out and every sum is right."""
  p = run_program("fault_modes", "delay_rank", env={"JAX_LLAR_TIMEOUT_MS": "3000"})
  assert p.data is not None, p.tail
  assert p.data["error"] is None and p.data["correct"] is True, p.tail
  assert p.data["seconds"] >= 0.1, p.data


def test_f12_rank_delayed_past_the_timeout_fails_with_report():
  """The same delay with a 20 ms timeout: the bounded-wait error instead."""
  p = run_program("fault_modes", "delay_rank", env={"JAX_LLAR_TIMEOUT_MS": "20"})
  assert p.data is not None, p.tail
  assert p.data["error"] is not None and p.data["correct"] is None, p.tail
  assert _report_of(p.data["reports"], rank=0, peer=1), p.data["reports"]
