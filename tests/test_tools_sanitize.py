"""The sanitize tool without a GPU: reading compute-sanitizer's report, the
verdict per unit, the matrix, the command line.

The report texts below are in the format compute-sanitizer 2025 prints; the
first is the report the one-block fused kernel produced on one H200
(benchmarks/NOTES.md records the run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from jax_llar.tools.loopback import harness as lh
from jax_llar.tools.sanitize import harness as sanitize

ONE_BLOCK_CLUSTER = textwrap.dedent("""\
    ========= COMPUTE-SANITIZER
    W=2  bfloat16 w=bfloat16 1x64 cluster 1x32
    ========= Invalid __shared__ write of size 4 bytes
    =========     at void llar::OneShotLLAddRmsNormKernel<__nv_bfloat16, __nv_bfloat16, (int)2>(llar::AddRmsNormArgs)+0x1b30
    =========     by thread (0,0,0) in block (0,0,0)
    =========     Cluster needs to have at least 2 blocks
    =========
    ========= Program hit cudaErrorLaunchFailure (error 719) due to "unspecified launch failure" on CUDA API call to cudaStreamSynchronize.
    =========     Saved host backtrace up to driver entry point at error
    =========
    ========= ERROR SUMMARY: 2 errors
    """)

CLEAN = "========= COMPUTE-SANITIZER\ncases: 12 pass\n========= ERROR SUMMARY: 0 errors\n"
TRAP_ONLY = textwrap.dedent("""\
    ========= COMPUTE-SANITIZER
    ========= Program hit cudaErrorLaunchFailure (error 719) due to "unspecified launch failure" on CUDA API call to cudaStreamQuery.
    =========     Saved host backtrace up to driver entry point at error
    ========= ERROR SUMMARY: 1 error
    ========= COMPUTE-SANITIZER
    ========= ERROR SUMMARY: 0 errors
    """)
RACE = textwrap.dedent("""\
    ========= COMPUTE-SANITIZER
    ========= Error: Race reported between Write access at void k()+0x50
    =========     and Read access at void k()+0x70 [4 hazards]
    =========
    ========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
    """)

CLEAN_UNIT = sanitize.Unit("u", ())
FAULT_UNIT = sanitize.Unit("f", (), fault=True)


def test_the_one_block_cluster_report_is_a_defect():
  parsed = sanitize.parse_report(ONE_BLOCK_CLUSTER)
  assert parsed["summaries"] == 1 and parsed["errors"] == 2
  assert parsed["defects"] == 1
  assert any(h.startswith("Invalid __shared__ write") for h in parsed["reports"])
  # The program's own line and the continuation lines are not reports.
  assert len(parsed["reports"]) == 2
  for unit in (CLEAN_UNIT, FAULT_UNIT):
    status, why = sanitize.verdict(unit, parsed, 0, {"pass": 1})
    assert status == "fail" and why, unit


def test_a_clean_report_passes_a_clean_unit_only_when_the_harness_passed():
  parsed = sanitize.parse_report(CLEAN)
  assert parsed == {"summaries": 1, "errors": 0, "reports": {}, "defects": 0}
  assert sanitize.verdict(CLEAN_UNIT, parsed, 0, {"pass": 3, "skipped": 1})[0] == "pass"
  assert sanitize.verdict(CLEAN_UNIT, parsed, 1, {"pass": 3})[0] == "fail"
  assert sanitize.verdict(CLEAN_UNIT, parsed, 0, {"pass": 3, "fail": 1})[0] == "fail"
  assert sanitize.verdict(CLEAN_UNIT, parsed, 0, {"skipped": 2})[0] == "fail"
  assert sanitize.verdict(CLEAN_UNIT, parsed, 0, {})[0] == "fail"


def test_a_trap_is_expected_in_a_fault_unit_and_an_error_elsewhere():
  parsed = sanitize.parse_report(TRAP_ONLY)
  assert parsed["summaries"] == 2 and parsed["errors"] == 1 and parsed["defects"] == 0
  assert sanitize.verdict(FAULT_UNIT, parsed, 0, {"pass": 1}) == ("pass", [])
  assert sanitize.verdict(CLEAN_UNIT, parsed, 0, {"pass": 1})[0] == "fail"
  # The fault unit's own check must still hold.
  assert sanitize.verdict(FAULT_UNIT, parsed, 0, {"fail": 1})[0] == "fail"


def test_racecheck_hazards_and_a_missing_summary_fail():
  parsed = sanitize.parse_report(RACE)
  assert parsed["errors"] == 1 and parsed["defects"] == 1
  assert sanitize.verdict(FAULT_UNIT, parsed, 0, {"pass": 1})[0] == "fail"
  cut = sanitize.parse_report("========= COMPUTE-SANITIZER\n")
  status, why = sanitize.verdict(CLEAN_UNIT, cut, 0, {"pass": 1})
  assert status == "fail" and "no sanitizer summary" in why[0]
  warned = sanitize.parse_report(
      "========= RACECHECK SUMMARY: 2 hazards displayed (0 errors, 2 warnings)\n")
  assert warned["errors"] == 2


def test_the_full_matrix_covers_every_simulated_algorithm_and_fault():
  units = sanitize.FULL
  algorithms = {a.split("=", 1)[1] for u in units for a in u.args
                if a.startswith("--algorithm=")}
  assert algorithms == set(lh.ALGORITHMS) - set(lh.NOT_SIMULATED)
  assert any("--op=add_rms_norm" in u.args for u in units)
  # A rank left out, and a mispaired call (the foreign-signature report
  # that extra_call and swap_signature both end in).
  faults = {json.loads(u.spec)["fault"] for u in units if u.fault}
  assert faults == {"skip", "extra_call"}
  for u in units:
    if u.fault:
      spec = json.loads(u.spec)
      assert spec["algorithm"] in lh.ALGORITHMS and not u.args
      settings = lh.Settings(worlds=(spec["world"],), dtypes=(spec["dtype"],),
                             sizes=(spec["n_bytes"],), calls=spec["calls"],
                             timeout_ms=spec["timeout_ms"], algorithm=spec["algorithm"])
      assert not lh.validate(settings), u.name
      assert spec["skip_call"] < spec["calls"] and spec["fault_call"] < spec["calls"]
  assert len({u.name for u in units}) == len(units)
  # The fused op's one-block (d = 64) and 8-block (d = 16384) rows, rows 1-32.
  fused = next(u for u in units if "--op=add_rms_norm" in u.args)
  shapes = next(a for a in fused.args if a.startswith("--shapes=")).split("=")[1].split(",")
  assert {"1x64", "32x64", "1x16384"} <= set(shapes)
  # Every world size 2-16 that a kernel specialises or runs at run time.
  worlds = {int(w) for u in units for a in u.args if a.startswith("--worlds=")
            for w in a.split("=")[1].split(",")}
  assert {2, 3, 4, 5, 8, 16} <= worlds


def test_every_unit_is_a_valid_loopback_command():
  """Each unit's arguments pass the loopback tool's own validation (run in
  one child process: absl's flags are process-wide)."""
  code = textwrap.dedent("""\
      import sys
      from absl import flags
      from jax_llar.tools.loopback import cli as loopback
      from jax_llar.tools.sanitize import harness as sanitize
      from jax_llar.tools.loopback import harness as lh
      bad = []
      for u in sanitize.FULL + sanitize.SMALL:
        if u.fault:
          continue
        flags.FLAGS.unparse_flags()
        flags.FLAGS(["loopback", *u.args])
        s = loopback.settings_from_flags()
        errors = [e for e in lh.validate(s)
                  if not (loopback.OP.value == "add_rms_norm" and e.startswith("sizes"))]
        loopback.lf.parse_shapes(loopback.SHAPES.value)
        if errors:
          bad.append((u.name, errors))
      print(bad)
      sys.exit(1 if bad else 0)
      """)
  p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                     timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]


def test_the_command_follows_children_and_names_the_tool():
  cmd = sanitize.command("/x/compute-sanitizer", "racecheck", CLEAN_UNIT, "/tmp/r.json")
  assert cmd[0] == "/x/compute-sanitizer" and "--tool=racecheck" in cmd
  assert "--target-processes=all" in cmd
  assert cmd[cmd.index("-m") + 1] == "jax_llar.tools.loopback"
  fault = next(u for u in sanitize.FULL if u.fault)
  cmd = sanitize.command("/x/compute-sanitizer", "memcheck", fault, "/tmp/r.json")
  assert cmd[cmd.index("-m") + 1] == lh.CHILD and json.loads(cmd[-1]) == json.loads(fault.spec)


def test_first_report_quotes_the_defect():
  lines = sanitize.first_report(ONE_BLOCK_CLUSTER)
  assert lines[0].endswith("Invalid __shared__ write of size 4 bytes")
  assert any("Cluster needs to have at least 2 blocks" in ln for ln in lines)
  assert not any("Program hit" in ln for ln in lines)
  assert sanitize.first_report(CLEAN) == []


def test_cli_errors_are_one_line_without_a_gpu(tmp_path):
  def cli(*args):
    return subprocess.run([sys.executable, "-m", "jax_llar.tools.sanitize", *args],
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))

  p = cli("--tools=memcheck,bogus")
  assert p.returncode == 1 and "--tools must be among" in p.stdout and "Traceback" not in p.stderr
  p = cli("--units=nope")
  assert p.returncode == 1 and "no unit nope" in p.stdout
  p = cli(f"--sanitizer={tmp_path / 'missing'}")
  assert p.returncode == 1 and "is not executable" in p.stdout
  fake = tmp_path / "compute-sanitizer"
  fake.write_text("#!/bin/sh\necho 'Version 2025.3.1'\n")
  fake.chmod(0o755)
  p = cli(f"--sanitizer={fake}", f"--json={tmp_path / 'r.json'}")
  assert p.returncode == 1 and "needs one CUDA GPU" in p.stdout, p.stdout + p.stderr
  assert "Traceback" not in p.stdout + p.stderr
  assert not (tmp_path / "r.json").exists()


def test_run_starts_the_slowest_tools_first_and_faults_last(monkeypatch):
  """`run` starts the clean runs racecheck first, then initcheck, then
  memcheck and synccheck; the fault units after every clean run, one at a
  time; the rows come back in (unit, tool) order."""
  started = []

  def fake_run_unit(sanitizer, tool, unit, work, timeout_s):
    del sanitizer, work, timeout_s
    started.append((tool, unit.name))
    return {"tool": tool, "unit": unit.name, "fault": unit.fault, "status": "pass",
            "sanitizer_errors": 0, "defects": 0, "expected": 0, "cases": {"pass": 1},
            "seconds": 0.0}

  monkeypatch.setattr(sanitize, "run_unit", fake_run_unit)
  rows = sanitize.run("cs", sanitize.TOOLS, sanitize.SMALL, jobs=1, unit_timeout_s=1.0)
  clean = [u.name for u in sanitize.SMALL if not u.fault]
  assert started == ([(t, u) for t in ("racecheck", "initcheck", "memcheck", "synccheck")
                      for u in clean] + [("memcheck", "fault.skip.one_shot_ll")])
  assert [(r["tool"], r["unit"]) for r in rows] == [
      (t, u.name) for u in sanitize.SMALL for t in sanitize.TOOLS
      if not u.tools or t in u.tools]
