"""jax_llar.tools.soak without a GPU: the size draw, the tally and its
record, the loopback loop's counting, skipping and stopping (with a stand-in
for the harness's run_case), and the command line's refusals."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from jax_llar.tools.soak import run as soak

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_sizes_are_whole_elements_within_the_limit_and_span_the_range():
  rng = np.random.default_rng(0)
  for itemsize, limit in ((4, 262144), (2, 4 << 20), (4, 4), (2, 6)):
    sizes = [soak.log_uniform_size(rng, itemsize, limit) for _ in range(4000)]
    assert all(s % itemsize == 0 and itemsize <= s <= limit for s in sizes), (itemsize, limit)
    if limit >= 1 << 16:
      # Small calls dominate, and every power-of-two class up to the limit occurs.
      assert np.median(sizes) < limit / 16
      classes = {int(np.log2(s)) for s in sizes}
      assert set(range(int(np.log2(itemsize)), int(np.log2(limit)) + 1)) <= classes
      assert any(s // itemsize % 2 for s in sizes)  # odd element counts


def _row(status, calls, **kw):
  return {"status": status, "calls_checked": calls, **kw}


def test_loopback_loop_counts_every_checked_call_and_stops_at_the_goal():
  seen = []

  def run_case(mod, s, case, rng):
    del mod, rng
    seen.append((s.algorithm, case.world, case.dtype, case.n_bytes, s.calls, s.sync))
    assert s.keep == 0 and s.calls >= 1  # every call is checked
    return _row("pass", s.calls)

  tally = soak.Tally(10_000)
  soak.run_loopback(tally, ["one_shot_ll", "two_shot_ll"], ["float32", "bfloat16"], [2, 5],
                    262144, 700, 4, 1000, np.random.default_rng(1), 1e9, run_case=run_case)
  rec = tally.record()
  assert rec["calls_checked"] == 10_000 and rec["passed"] and rec["mismatches"] == 0
  assert sum(c for *_, c, _ in seen) == 10_000 and all(c <= 700 for *_, c, _ in seen)
  assert set(rec["calls_by_algorithm"]) == {"one_shot_ll", "two_shot_ll"}
  assert sum(rec["calls_by_dtype"].values()) == 10_000
  assert set(rec["calls_by_world_size"]) == {"2", "5"}
  assert {sync for *_, sync in seen} == {True, False}


def test_loopback_loop_skips_refused_cases_and_stops_at_a_failure():
  calls = iter(["skip", "pass", "fail"])

  def run_case(mod, s, case, rng):
    del mod, case, rng
    what = next(calls)
    if what == "skip":
      return _row("skipped", 0, reason="int32 is not served")
    if what == "pass":
      return _row("pass", s.calls)
    return _row("fail", s.calls, first_mismatch={"call": 3, "rank": 1})

  tally = soak.Tally(1_000_000)
  soak.run_loopback(tally, ["one_shot_sentinel"], ["int32"], [2], 4096, 100, 2, 1000,
                    np.random.default_rng(2), 1e9, run_case=run_case)
  rec = tally.record()
  assert rec["calls_checked"] == 100 and not rec["passed"]
  assert rec["mismatches"] == 1 and rec["first_mismatch"] == {"call": 3, "rank": 1}
  assert rec["failure"]["status"] == "fail" and rec["failure"]["algorithm"] == "one_shot_sentinel"
  assert rec["skipped"] == {"one_shot_sentinel: int32 is not served": 1}


def test_a_case_that_checked_fewer_calls_than_it_ran_fails_the_soak():
  tally = soak.Tally(50)
  soak.run_loopback(tally, ["one_shot_ll"], ["float32"], [2], 1024, 50, 2, 1000,
                    np.random.default_rng(3), 1e9,
                    run_case=lambda m, s, c, r: _row("pass", s.calls - 1))
  assert tally.failure is not None and not tally.record()["passed"]


def test_progress_line_estimates_the_time_left(capsys):
  tally = soak.Tally(1000)
  tally.started -= 10.0  # ten seconds ago
  tally.add(250, "one_shot_ll", "float32", 2)
  tally.progress(0.0, force=True)
  line = capsys.readouterr().out
  assert "250/1,000 calls checked" in line and "25.0%" in line
  assert "about 30 s left" in line  # 25 calls/s, 750 to go


@pytest.mark.parametrize("mode", ["jax", "loopback"])
def test_command_line_refuses_without_gpus(tmp_path, mode):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  p = subprocess.run([sys.executable, "-m", "jax_llar.tools.soak", f"--mode={mode}",
                      "--calls=10", f"--json={tmp_path / 'soak.json'}"],
                     cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert p.returncode == 1, p.stdout + p.stderr
  assert ("needs 2+ GPUs" if mode == "jax" else "no CUDA GPU here") in p.stdout
  assert not (tmp_path / "soak.json").exists()


def test_command_line_refuses_an_unknown_dtype(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  p = subprocess.run([sys.executable, "-m", "jax_llar.tools.soak", "--dtypes=float64",
                      "--calls=10"], cwd=ROOT, env=env, capture_output=True, text=True,
                     timeout=300)
  assert p.returncode == 1 and "unknown dtype 'float64'" in p.stdout, p.stdout + p.stderr


def test_max_seconds_stops_unfinished_with_the_record_so_far():
  tally = soak.Tally(10**9)
  tally.max_seconds = 0.05
  soak.run_loopback(tally, ["one_shot_ll"], ["float32"], [2], 1024, 100, 2, 1000,
                    np.random.default_rng(4), 1e9,
                    run_case=lambda m, s, c, r: _row("pass", s.calls))
  rec = tally.record()
  assert rec["stopped_at_max_seconds"] and not rec["passed"]
  assert 0 < rec["calls_checked"] < 10**9 and rec["failure"] is None


def test_a_soak_whose_cases_are_all_skipped_ends_as_a_failure():
  tally = soak.Tally(1000)
  soak.run_loopback(tally, ["one_shot_sentinel"], ["int32"], [2], 1024, 100, 2, 1000,
                    np.random.default_rng(5), 1e9,
                    run_case=lambda m, s, c, r: _row("skipped", 0, reason="int32 refused"))
  rec = tally.record()
  assert not rec["passed"] and rec["calls_checked"] == 0
  assert "all skipped" in rec["failure"]["error"]
  assert rec["units"] == soak.MAX_SKIPPED_BEFORE_ANY


def test_a_case_the_harness_refuses_is_skipped_not_fatal():
  def run_case(mod, s, case, rng):
    del mod, rng
    if case.dtype == "int32":
      raise ValueError("one_shot_sentinel does not serve int32")
    return _row("pass", s.calls)

  tally = soak.Tally(2000)
  soak.run_loopback(tally, ["one_shot_sentinel"], ["int32", "float32"], [2], 1024, 100, 2,
                    1000, np.random.default_rng(6), 1e9, run_case=run_case)
  rec = tally.record()
  assert rec["passed"] and rec["calls_by_dtype"] == {"float32": 2000}
  assert any("does not serve int32" in k for k in rec["skipped"])
