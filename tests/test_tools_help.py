"""The command-line tools' --help (issue 15): every program reads without
references to files outside the repository, internal options or reST markup,
list defaults print as comma lists, and results default to a scratch folder;
--help and absl's other help flags exit with status 0 (absl's own exit with
1: jax_llar.tools._cli)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROGRAMS = {
    "bench": [sys.executable, "-m", "jax_llar.tools.bench", "--help"],
    "sol": [sys.executable, "-m", "jax_llar.tools.sol", "--help"],
    "graphcheck": [sys.executable, "-m", "jax_llar.tools.graphcheck", "--help"],
    "loopback": [sys.executable, "-m", "jax_llar.tools.loopback", "--help"],
    "tune": [sys.executable, "-m", "jax_llar.tools.tune", "--help"],
    "soak": [sys.executable, "-m", "jax_llar.tools.soak", "--help"],
    "store_atomicity": [sys.executable, "-m", "jax_llar.tools.store_atomicity", "--help"],
    "launch": [sys.executable, "-m", "jax_llar.tools.launch", "--help"],
    "tp_decode": [sys.executable, "examples/tp_decode/main.py", "--help"],
}


def _run(argv: list[str]) -> subprocess.CompletedProcess:
  return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True,
                        timeout=120, env=dict(os.environ, TMPDIR=tempfile.gettempdir()))


def _help(name: str) -> str:
  p = _run(PROGRAMS[name])
  # The help was asked for and given: a success (absl itself exits with 1).
  assert p.returncode == 0 and "flags:" in p.stdout, (p.returncode, p.stderr[-2000:])
  return p.stdout + p.stderr


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_help_reads_well(name):
  text = _help(name)
  for bad in ("BENCHMARK.md", "MEASURED.md", "``", "--convert", "Traceback", "['"):
    assert bad not in text, (bad, text)
  assert "flags:" in text


@pytest.mark.parametrize("flag", ["-?", "--helpshort", "--helpfull", "--helpxml"])
def test_every_help_flag_exits_zero(flag):
  p = _run([sys.executable, "-m", "jax_llar.tools.sol", flag])
  assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
  assert "iters" in p.stdout


@pytest.mark.parametrize("argv", [["--no_such_flag"], ["stray"]])
def test_a_bad_command_line_still_exits_one(argv):
  p = _run([sys.executable, "-m", "jax_llar.tools.sol", *argv])
  assert p.returncode == 1
  assert "no_such_flag" in p.stderr or "unexpected arguments: stray" in p.stdout + p.stderr


def test_bench_help_lists_defaults_and_scratch_folder():
  text = _help("bench")
  assert "(default: 'f32,bf16')" in text
  assert "(default: '64,256,1024,4096,16384,65536,262144')" in text
  assert os.path.join(tempfile.gettempdir(), "jax_llar_results") in text
  assert "benchmarks/METHOD.md" in text


def test_result_files_are_never_overwritten(tmp_path):
  """A second result of the same name on the same day gets a suffix; both
  files stay."""
  from jax_llar.tools import report
  first = report.save({"rows": [], "n": 1}, str(tmp_path), "m-20260101-jax")
  second = report.save({"rows": [], "n": 2}, str(tmp_path), "m-20260101-jax")
  third = report.save({"rows": [], "n": 3}, str(tmp_path), "m-20260101-jax")
  names = [os.path.basename(p[0]) for p in (first, second, third)]
  assert names == ["m-20260101-jax.json", "m-20260101-jax-2.json", "m-20260101-jax-3.json"]
  for p, n in zip((first, second, third), (1, 2, 3)):
    with open(p[0]) as f:
      assert json.load(f)["n"] == n


def test_graphcheck_without_gpu_says_so():
  p = subprocess.run([sys.executable, "-m", "jax_llar.tools.graphcheck"],
                     capture_output=True, text=True, timeout=120,
                     env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert p.returncode == 1
  assert "needs CUDA GPUs" in p.stdout and "in_command_buffer" not in p.stdout
