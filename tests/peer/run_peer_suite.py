"""Runs JAX's own shard_map and pmap tests, stock or with jax_llar's swap.

Usage (from the repository root):

  python tests/peer/run_peer_suite.py --jax_source /path/to/jax.git --mode both

Where the tests come from: ``tests/<suite>_test.py`` of the JAX source, read
at ``--ref`` (a tag, branch or commit) from a git directory with
``git show``, or copied from a directory (a JAX checkout, or a scratch
directory this runner extracted before, e.g. one carried to another machine).
Without ``--ref`` the tag of the installed JAX is used (``jax-v0.12.0.1``,
then ``jax-v0.12.0``, then ``release/0.12.0``); if the source has none of
them, its HEAD, and the result says so. JAX's top-level ``conftest.py`` and
``pyproject.toml`` (its pytest settings: warnings are errors, importlib
import mode) and any sibling module a test file imports are extracted too.
Everything goes to ``--scratch/<jax version>/``, which git ignores; nothing
of JAX's is copied into the tracked tree.

The parts that run nothing (extraction, junit parsing, counting, comparing,
the child's environment) are in ``suite_lib.py``, tested by
``tests/test_peer_runner.py``.

How the tests run: one pytest process per suite and mode, with the Python
running this script, ``--junitxml`` for the per-test outcomes. On CPU (found
by asking JAX in a child process) it sets ``JAX_PLATFORMS=cpu`` and forces
``--devices`` host devices (``JAX_NUM_CPU_DEVICES`` and
``--xla_force_host_platform_device_count``); on a GPU machine it leaves the
platform alone. A run longer than ``--timeout_s`` is interrupted (pytest
still writes the outcomes so far) and marked ``timed_out``.

How the swap is applied: ``swap_plugin.py`` (this directory) is loaded with
``-p`` in both modes. In ``swapped`` mode the child also gets
``JAX_LLAR_SWAP=1`` and the plugin calls ``jax_llar.install()`` before the
test modules are imported, failing the run if there is no such function. The
plugin's facts (swap installed, jax_llar version, JAX's platform and device
count, the dispatch decisions) go into the result.

How results are compared: each run writes
``<out>/peer-<suite>-<jax>-<platform>-<mode>-<YYYYMMDD>.json`` (counts,
failing ids, every outcome, versions, source ref, command). ``--mode both``
also writes ``...-compare-<YYYYMMDD>.json``; its ``regressions`` (passed
stock, failed, errored or did not run swapped) is the list that must be
empty.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import pathlib
import platform as py_platform
import shlex
import signal
import subprocess
import sys
import time

from absl import app, flags

import suite_lib
from suite_lib import MODES, REPO, SUITES

_SUITES = flags.DEFINE_list("suites", list(SUITES),
                            "Suites to run (JAX's tests/<suite>_test.py).")
_JAX_SOURCE = flags.DEFINE_string(
    "jax_source", None, "JAX source: a git directory (bare or a checkout's "
    ".git) or a directory holding tests/<suite>_test.py.", required=True)
_REF = flags.DEFINE_string(
    "ref", None, "Tag, branch or commit to read from a git --jax_source; "
    "default: the installed JAX's tag, else HEAD (recorded).")
_MODE = flags.DEFINE_enum("mode", "stock", list(MODES) + ["both"],
                          "stock, swapped (jax_llar.install()) or both.")
_DEVICES = flags.DEFINE_integer("devices", 8, "Host devices forced on CPU.")
_OUT = flags.DEFINE_string("out", str(REPO / "tests" / "results"),
                           "Directory for the result JSON files.")
_SCRATCH = flags.DEFINE_string(
    "scratch", str(REPO / ".scratch" / "peer"),
    "Directory (git-ignored) for the extracted files, junit XML and logs.")
_K = flags.DEFINE_string("k", None, "pytest -k expression, passed through.")
_TIMEOUT_S = flags.DEFINE_integer(
    "timeout_s", 3600, "Limit on one pytest run (one suite, one mode), s.")


def probe_platform() -> str:
  """JAX's default backend in a child process (the environment as given)."""
  out = subprocess.run(
      [sys.executable, "-c", "import jax; print(jax.default_backend())"],
      capture_output=True, text=True, timeout=600, check=True).stdout
  return out.split()[-1]


def run_pytest(cmd: list[str], env: dict, log: pathlib.Path,
               timeout_s: int) -> tuple[int, bool, float]:
  """Runs `cmd`; on timeout interrupts it (pytest then writes its junit)."""
  start = time.monotonic()
  with open(log, "w", encoding="utf-8") as f:
    proc = subprocess.Popen(cmd, env=env, cwd=str(REPO), stdout=f,
                            stderr=subprocess.STDOUT, start_new_session=True)
    timed_out = False
    try:
      rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
      timed_out = True
      proc.send_signal(signal.SIGINT)
      try:
        rc = proc.wait(timeout=180)
      except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        rc = proc.wait()
  return rc, timed_out, time.monotonic() - start


def run_suite(suite: str, mode: str, work: pathlib.Path, source: dict,
              cpu: bool, stamp: str) -> dict:
  junit = work / f"junit-{suite}-{mode}.xml"
  facts = work / f"facts-{suite}-{mode}.json"
  log = work / f"log-{suite}-{mode}.txt"
  for p in (junit, facts):
    p.unlink(missing_ok=True)
  cmd = [sys.executable, "-m", "pytest", "-c", str(work / "pyproject.toml"),
         "--rootdir", str(work), "-p", "swap_plugin", "-p", "no:cacheprovider",
         "-q", "-rfE", f"--junitxml={junit}",
         str(work / "tests" / f"{suite}_test.py")]
  if _K.value:
    cmd += ["-k", _K.value]
  env = suite_lib.child_env(mode, cpu, _DEVICES.value, facts)
  print(f"[peer] {suite} {mode}: running (log {log})", flush=True)
  rc, timed_out, wall = run_pytest(cmd, env, log, _TIMEOUT_S.value)
  if not junit.exists():
    tail = "".join(log.read_text(errors="replace").splitlines(True)[-15:])
    raise RuntimeError(f"{suite} {mode}: pytest exited {rc} without a junit "
                       f"file; the end of {log}:\n{tail}")
  outcomes, messages = suite_lib.parse_junit(junit.read_text())
  plugin = json.loads(facts.read_text()) if facts.exists() else {}
  if mode == "swapped" and not plugin.get("swap_installed"):
    raise RuntimeError(f"{suite}: swapped run without the swap: {plugin}")
  set_env = {k: env[k] for k in ("JAX_PLATFORMS", "JAX_NUM_CPU_DEVICES",
                                 "XLA_FLAGS", "JAX_LLAR_SWAP",
                                 "JAX_NUM_GENERATED_CASES") if k in env}
  return {
      "suite": suite, "mode": mode, "date": stamp,
      "jax": importlib.metadata.version("jax"),
      "jaxlib": importlib.metadata.version("jaxlib"),
      "python": py_platform.python_version(),
      "platform": plugin.get("platform", "cpu" if cpu else None),
      "device_count": plugin.get("device_count"),
      "devices_forced": _DEVICES.value if cpu else None,
      "jax_source": source, "jax_llar": suite_lib.llar_commit(),
      "plugin": plugin,
      "command": shlex.join(cmd), "env_set": set_env,
      "runner_command": shlex.join([sys.executable] + sys.argv),
      "pytest_exit_code": rc, "timed_out": timed_out, "wall_s": round(wall, 1),
      **suite_lib.summarize(outcomes, messages),
      "outcomes": dict(sorted(outcomes.items())),
  }


def _write(path: pathlib.Path, obj: dict) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(obj, indent=1) + "\n")
  print(f"[peer] wrote {path}", flush=True)


def main(argv: list[str]) -> int:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  bad = set(_SUITES.value) - set(SUITES)
  if bad:
    raise app.UsageError(f"unknown suites {sorted(bad)}; known: {SUITES}")
  jax_version = importlib.metadata.version("jax")
  work = pathlib.Path(_SCRATCH.value) / jax_version
  work.mkdir(parents=True, exist_ok=True)
  info = suite_lib.extract(pathlib.Path(_JAX_SOURCE.value), _REF.value,
                           _SUITES.value, work, jax_version)
  print(f"[peer] JAX {jax_version}; tests from {info.get('ref')} "
        f"({info.get('commit')}) {info.get('note') or ''}", flush=True)
  cpu = probe_platform() == "cpu"
  stamp = datetime.date.today().strftime("%Y%m%d")
  modes = list(MODES) if _MODE.value == "both" else [_MODE.value]
  out, status = pathlib.Path(_OUT.value), 0
  for suite in _SUITES.value:
    results = {}
    for mode in modes:
      r = results[mode] = run_suite(suite, mode, work, info, cpu, stamp)
      name = f"peer-{suite}-{jax_version}-{r['platform']}-{mode}-{stamp}.json"
      _write(out / name, r)
      print(f"[peer] {suite} {mode}: {r['counts']} in {r['wall_s']} s"
            + (" (TIMED OUT)" if r["timed_out"] else ""), flush=True)
      status |= int(r["timed_out"])
    if len(results) == 2:
      diff = suite_lib.compare(results["stock"]["outcomes"],
                               results["swapped"]["outcomes"])
      cmp = {k: results["stock"][k] for k in
             ("suite", "date", "jax", "jaxlib", "platform", "device_count",
              "jax_source", "jax_llar")}
      cmp.update(counts={m: results[m]["counts"] for m in modes}, **diff)
      name = (f"peer-{suite}-{jax_version}-{results['stock']['platform']}"
              f"-compare-{stamp}.json")
      _write(out / name, cmp)
      print(f"[peer] {suite}: {len(diff['regressions'])} pass stock and "
            "fail swapped", flush=True)
      status |= int(bool(diff["regressions"]))
  return status


if __name__ == "__main__":
  app.run(main)
