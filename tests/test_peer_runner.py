"""The peer-suite runner (``tests/peer/``) without running JAX's tests.

Reading junit XML into outcomes and counts, the stock/swapped comparison,
the refs tried for an installed JAX, extracting the test files from a tiny
git repository, the child's environment, and the swap plugin's refusal to
run a swapped suite without ``jax_llar.install()``. JAX's own tests are not
run here: ``tests/peer/run_peer_suite.py`` does that, on request.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import types

import pytest

PEER = pathlib.Path(__file__).parent / "peer"
sys.path.insert(0, str(PEER))
import suite_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
import swap_plugin  # pylint: disable=g-import-not-at-top,wrong-import-position

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="7">
 <testcase classname="pmap_test.PmapTest" name="test_ok" time="0.1"/>
 <testcase classname="pmap_test.PmapTest" name="test_bad" time="0.1">
  <failure message="AssertionError: 1 != 2&#10;second line">trace</failure>
 </testcase>
 <testcase classname="pmap_test.PmapTest" name="test_setup" time="0.0">
  <error message="failed on setup with &quot;RuntimeError: x&quot;">e</error>
 </testcase>
 <testcase classname="pmap_test.PmapTest" name="test_gpu" time="0.0">
  <skipped type="pytest.skip" message="Skipped: needs a GPU">s</skipped>
 </testcase>
 <testcase classname="pmap_test.PmapTest" name="test_tpu" time="0.0">
  <skipped type="pytest.skip" message="Skipped: needs a GPU">s</skipped>
 </testcase>
 <testcase classname="pmap_test.PmapTest" name="test_twice" time="0.1"/>
 <testcase classname="pmap_test.PmapTest" name="test_twice" time="0.0">
  <error message="failed on teardown">e</error>
 </testcase>
 <!-- what pytest writes for the test it was running when interrupted -->
 <testcase time="0.000"/>
</testsuite></testsuites>
"""


def test_junit_outcomes_and_first_lines():
  outcomes, messages = suite_lib.parse_junit(JUNIT)
  p = "pmap_test.PmapTest::"
  assert outcomes == {p + "test_ok": "passed", p + "test_bad": "failed",
                      p + "test_setup": "error", p + "test_gpu": "skipped",
                      p + "test_tpu": "skipped", p + "test_twice": "error"}
  assert messages[p + "test_bad"] == "AssertionError: 1 != 2"
  assert p + "test_ok" not in messages


def test_summary_counts_failing_and_skip_reasons():
  s = suite_lib.summarize(*suite_lib.parse_junit(JUNIT))
  assert s["counts"] == {"passed": 1, "failed": 1, "skipped": 2, "errors": 2,
                         "total": 6}
  assert s["failing"] == ["pmap_test.PmapTest::test_bad",
                          "pmap_test.PmapTest::test_setup",
                          "pmap_test.PmapTest::test_twice"]
  assert s["skip_reasons"] == {"Skipped: needs a GPU": 2}


def test_compare_lists_what_passed_stock_and_not_swapped():
  stock = {"a": "passed", "b": "passed", "c": "passed", "d": "passed",
           "e": "failed", "f": "skipped"}
  swapped = {"a": "passed", "b": "failed", "c": "error", "d": "skipped",
             "e": "passed", "f": "passed", "g": "passed"}
  diff = suite_lib.compare(stock, swapped)
  assert diff["regressions"] == ["b", "c"]
  assert diff["passed_stock_skipped_swapped"] == ["d"]
  assert diff["fixed"] == ["e", "f"]
  assert diff["only_in_swapped"] == ["g"]
  # A test the swapped run never reached counts against it.
  assert suite_lib.compare({"a": "passed"}, {})["regressions"] == ["a"]
  assert suite_lib.compare(stock, stock)["regressions"] == []


def test_refs_tried_for_an_installed_version():
  assert suite_lib.candidate_refs("0.12.0.1") == [
      "jax-v0.12.0.1", "jax-v0.12.0", "release/0.12.0"]
  assert suite_lib.candidate_refs("0.11.2") == ["jax-v0.11.2",
                                                "release/0.11.2"]


def _git(repo, *args):
  subprocess.run(["git", "-C", str(repo), *args], check=True,
                 capture_output=True)


@pytest.fixture(name="jax_repo")
def _jax_repo(tmp_path):
  """A git repository laid out as JAX's, one commit tagged jax-v9.9.9."""
  repo = tmp_path / "jax"
  files = {"jax/version.py": '_version = "9.9.9"\n',
           "conftest.py": "", "pyproject.toml": "[tool.pytest.ini_options]\n",
           "tests/pmap_test.py": "import pmap_helper\nimport numpy\n",
           "tests/pmap_helper.py": "from other_helper import x\n",
           "tests/other_helper.py": "x = 1\n",
           "tests/shard_map_test.py": "import jax\n",
           "tests/unrelated_test.py": ""}
  for name, text in files.items():
    (repo / name).parent.mkdir(parents=True, exist_ok=True)
    (repo / name).write_text(text)
  _git(repo, "init", "-q")
  _git(repo, "add", ".")
  _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
  _git(repo, "tag", "jax-v9.9.9")
  return repo


def test_extract_from_git_at_the_installed_tag(jax_repo, tmp_path):
  dest = tmp_path / "scratch"
  info = suite_lib.extract(jax_repo / ".git", None, ["pmap"], dest, "9.9.9")
  assert info["ref"] == "jax-v9.9.9" and info["note"] is None
  assert info["jax_version_at_ref"] == "9.9.9"
  assert info["files"] == ["conftest.py", "pyproject.toml",
                           "tests/other_helper.py", "tests/pmap_helper.py",
                           "tests/pmap_test.py"]
  assert (dest / "tests" / "pmap_helper.py").exists()
  assert not (dest / "tests" / "shard_map_test.py").exists()
  assert json.loads((dest / "SOURCE.json").read_text()) == info


def test_extract_without_the_tag_uses_head_and_says_so(jax_repo, tmp_path):
  info = suite_lib.extract(jax_repo / ".git", None, ["shard_map"],
                           tmp_path / "s", "10.0.0")
  assert info["ref"] == "HEAD" and "jax-v10.0.0" in info["note"]


def test_extract_again_from_an_extracted_directory(jax_repo, tmp_path):
  first = suite_lib.extract(jax_repo / ".git", "jax-v9.9.9", ["pmap"],
                            tmp_path / "a", "9.9.9")
  again = suite_lib.extract(tmp_path / "a", None, ["pmap"], tmp_path / "b",
                            "9.9.9")
  assert again["commit"] == first["commit"] and again["ref"] == "jax-v9.9.9"
  assert (tmp_path / "b" / "tests" / "other_helper.py").exists()
  # In place: the directory is used as it is.
  assert suite_lib.extract(tmp_path / "b", None, ["pmap"], tmp_path / "b",
                           "9.9.9")["commit"] == first["commit"]


def test_child_environment(tmp_path):
  base = {"JAX_LLAR_SWAP": "1", "XLA_FLAGS": "--xla_dump_to=/tmp/d",
          "PYTHONPATH": "/elsewhere"}
  stock = suite_lib.child_env("stock", True, 8, tmp_path / "f.json", base)
  assert "JAX_LLAR_SWAP" not in stock
  assert stock["JAX_PLATFORMS"] == "cpu" and stock["JAX_NUM_CPU_DEVICES"] == "8"
  assert stock["XLA_FLAGS"] == ("--xla_dump_to=/tmp/d "
                                "--xla_force_host_platform_device_count=8")
  assert stock["PYTHONPATH"].split(":")[0] == str(PEER)
  assert stock["PYTHONPATH"].endswith(":/elsewhere")
  gpu = suite_lib.child_env("swapped", False, 8, tmp_path / "f.json", {})
  assert gpu["JAX_LLAR_SWAP"] == "1" and gpu["JAX_LLAR_PEER_MODE"] == "swapped"
  assert not {"JAX_PLATFORMS", "JAX_NUM_CPU_DEVICES", "XLA_FLAGS"} & set(gpu)


def test_swapped_mode_refuses_a_jax_llar_without_install(monkeypatch):
  monkeypatch.setenv("JAX_LLAR_PEER_MODE", "swapped")
  monkeypatch.setattr(swap_plugin, "_facts", {})
  monkeypatch.setitem(sys.modules, "jax_llar",
                      types.ModuleType("jax_llar", "no install here"))
  with pytest.raises(pytest.UsageError, match="has no install"):
    swap_plugin.pytest_configure()


def test_swapped_mode_installs_and_records(monkeypatch, tmp_path):
  fake = types.ModuleType("jax_llar")
  calls = []
  fake.install = lambda: calls.append("install")
  fake.installed = lambda: bool(calls)
  fake.__version__ = "9"
  monkeypatch.setitem(sys.modules, "jax_llar", fake)
  monkeypatch.setenv("JAX_LLAR_PEER_MODE", "swapped")
  monkeypatch.setenv("JAX_LLAR_PEER_FACTS", str(tmp_path / "facts.json"))
  monkeypatch.setattr(swap_plugin, "_facts", {})
  swap_plugin.pytest_configure()
  swap_plugin.pytest_sessionfinish()
  facts = json.loads((tmp_path / "facts.json").read_text())
  assert calls == ["install"]
  assert facts["swap_installed"] and facts["installed_at_end"]
  assert facts["mode"] == "swapped" and facts["jax_llar_version"] == "9"


def test_default_test_command_does_not_collect_jax_tests():
  """`pytest tests` collects test_*.py / *_test.py; the peer directory holds
  none, and JAX's files are extracted outside tests/."""
  peer_files = {p.name for p in PEER.iterdir()}
  assert not {n for n in peer_files
              if n.startswith("test_") or n.endswith("_test.py")}
  scratch = pathlib.Path(suite_lib.REPO, ".scratch")
  assert pathlib.Path(__file__).parent not in scratch.parents


def test_runner_help():
  p = subprocess.run([sys.executable, str(PEER / "run_peer_suite.py"),
                      "--helpshort"], capture_output=True, text=True,
                     check=False)
  assert p.returncode in (0, 1), p.stderr[-2000:]  # absl's help exits 1
  assert "--jax_source" in p.stdout and "--mode" in p.stdout
