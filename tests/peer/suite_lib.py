"""The parts of the peer-suite runner that do not run tests.

Extracting JAX's test files from a git directory or a plain directory,
reading pytest's junit XML into per-test outcomes, counting them, comparing
a stock run with a swapped one, and the environment of the pytest child.
``run_peer_suite.py`` is the command-line tool around them.
"""

from __future__ import annotations

import ast
import json
import os
import pathlib
import subprocess
import xml.etree.ElementTree as ET

REPO = pathlib.Path(__file__).resolve().parents[2]
PLUGIN_DIR = pathlib.Path(__file__).resolve().parent
SUITES = ("shard_map", "pmap")
MODES = ("stock", "swapped")
TOP_LEVEL_FILES = ("conftest.py", "pyproject.toml")


# --- sources -----------------------------------------------------------------


def git(*args: str, cwd: str | None = None) -> str:
  """stdout of `git args`; raises if git fails."""
  return subprocess.run(["git", *args], cwd=cwd, check=True, text=True,
                        capture_output=True).stdout


def is_git_dir(path: pathlib.Path) -> bool:
  try:
    return git("--git-dir", str(path), "rev-parse", "--git-dir") != ""
  except (subprocess.CalledProcessError, FileNotFoundError):
    return False


def candidate_refs(jax_version: str) -> list[str]:
  """Refs to try, nearest first, for an installed JAX version."""
  three = ".".join(jax_version.split(".")[:3])
  refs = [f"jax-v{jax_version}", f"jax-v{three}", f"release/{three}"]
  return list(dict.fromkeys(refs))


def _sibling_imports(source: str, siblings: set[str]) -> set[str]:
  """Module names imported by `source` that are files beside it."""
  found = set()
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      found.update(a.name.split(".")[0] for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      found.add(node.module.split(".")[0])
  return found & siblings


def _resolve_ref(git_dir: str, ref: str | None,
                 jax_version: str) -> tuple[str, str | None]:
  """(ref to read, note): `ref`, else the installed version's, else HEAD."""
  if ref:
    return ref, None
  tried = candidate_refs(jax_version)
  for r in tried:
    if subprocess.run(["git", "--git-dir", git_dir, "rev-parse", "--verify",
                       "-q", r + "^{commit}"], capture_output=True,
                      check=False).returncode == 0:
      return r, None
  return "HEAD", f"none of {tried} in the source; used its HEAD"


def extract(source: pathlib.Path, ref: str | None, suites: list[str],
            dest: pathlib.Path, jax_version: str) -> dict:
  """Writes the suites' files under `dest`; returns where they came from.

  `source` is a git directory (read at `ref` or the nearest ref to
  `jax_version`) or a plain directory (a checkout, or an earlier `dest`
  whose SOURCE.json is kept). `dest` may be `source` itself.
  """
  if is_git_dir(source):
    gd = str(source)
    resolved, note = _resolve_ref(gd, ref, jax_version)
    commit = git("--git-dir", gd, "rev-parse", resolved + "^{commit}").strip()

    def read(p: str) -> str:
      return git("--git-dir", gd, "show", f"{commit}:{p}")

    listing = git("--git-dir", gd, "ls-tree", "--name-only", commit, "tests/")
    siblings = {pathlib.PurePosixPath(p).stem for p in listing.split()
                if p.endswith(".py")}
    info = {"source": str(source.resolve()), "ref_requested": ref,
            "ref": resolved, "commit": commit,
            "commit_date": git("--git-dir", gd, "show", "-s", "--format=%cI",
                               commit).strip(),
            "jax_version_at_ref": _version_at(read("jax/version.py")),
            "note": note}
  else:
    if (source / "SOURCE.json").exists():
      info = json.loads((source / "SOURCE.json").read_text())
    else:
      info = {"source": str(source.resolve()), "ref_requested": ref,
              "ref": None, "commit": None, "note": "plain directory"}
      if is_git_dir(source / ".git"):
        info["commit"] = git("-C", str(source), "rev-parse", "HEAD").strip()

    def read(p: str) -> str:
      return (source / p).read_text()

    siblings = {p.stem for p in (source / "tests").glob("*.py")}
  texts: dict[str, str] = {}
  pending = [f"tests/{s}_test.py" for s in suites] + list(TOP_LEVEL_FILES)
  while pending:
    p = pending.pop()
    if p in texts:
      continue
    texts[p] = read(p)
    if p.startswith("tests/"):
      pending += [f"tests/{m}.py" for m in
                  _sibling_imports(texts[p], siblings - {pathlib.Path(p).stem})]
  if source.resolve() != dest.resolve():
    for p, text in texts.items():
      (dest / p).parent.mkdir(parents=True, exist_ok=True)
      (dest / p).write_text(text)
    info["files"] = sorted(texts)
    (dest / "SOURCE.json").write_text(json.dumps(info, indent=1) + "\n")
  return info


def _version_at(version_py: str) -> str | None:
  for line in version_py.splitlines():
    if line.startswith("_version"):
      return line.split("=", 1)[1].strip().strip("\"'")
  return None


def llar_commit() -> dict:
  """jax_llar's git commit and whether tracked files differ from it."""
  try:
    return {"commit": git("rev-parse", "HEAD", cwd=str(REPO)).strip(),
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no",
                              cwd=str(REPO)).strip())}
  except (subprocess.CalledProcessError, FileNotFoundError):
    return {"commit": None, "dirty": None}


# --- junit -------------------------------------------------------------------


OUTCOME_ORDER = ("failed", "error", "skipped", "passed")  # worst first


def parse_junit(xml_text: str) -> tuple[dict[str, str], dict[str, str]]:
  """(test id -> outcome, test id -> first line of the failure or skip).

  A test id is ``<classname>::<name>``; a test reported twice (a failure
  and a teardown error) keeps its worst outcome. The nameless entry pytest
  writes for the test it was running when interrupted is left out.
  """
  outcomes, messages = {}, {}
  for case in ET.fromstring(xml_text).iter("testcase"):
    if case.get("name") is None:
      continue
    tid = f"{case.get('classname')}::{case.get('name')}"
    outcome, message = "passed", None
    for tag, name in (("failure", "failed"), ("error", "error"),
                      ("skipped", "skipped")):
      child = case.find(tag)
      if child is not None:
        outcome = name
        message = (child.get("message") or child.text or "").strip()
        message = message.splitlines()[0][:300] if message else ""
        break
    if tid in outcomes:
      outcome = min(outcome, outcomes[tid], key=OUTCOME_ORDER.index)
    outcomes[tid] = outcome
    if message is not None and outcome != "passed":
      messages.setdefault(tid, message)
  return outcomes, messages


def counts(outcomes: dict[str, str]) -> dict[str, int]:
  c = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
  for o in outcomes.values():
    c["errors" if o == "error" else o] += 1
  c["total"] = len(outcomes)
  return c


def compare(stock: dict[str, str], swapped: dict[str, str]) -> dict:
  """What changed between the outcomes of a stock and a swapped run."""
  passed_stock = {t for t, o in stock.items() if o == "passed"}
  return {
      # What the project tracks: must be empty.
      "regressions": sorted(t for t in passed_stock
                            if swapped.get(t, "missing") in
                            ("failed", "error", "missing")),
      "passed_stock_skipped_swapped": sorted(
          t for t in passed_stock if swapped.get(t) == "skipped"),
      "fixed": sorted(t for t, o in swapped.items()
                      if o == "passed" and stock.get(t, "passed") != "passed"),
      "only_in_swapped": sorted(set(swapped) - set(stock)),
  }


def summarize(outcomes: dict[str, str], messages: dict[str, str]) -> dict:
  """Counts, failing ids (failed or error) with messages, skip reasons."""
  failing = sorted(t for t, o in outcomes.items() if o in ("failed", "error"))
  skips: dict[str, int] = {}
  for t, o in outcomes.items():
    if o == "skipped":
      skips[messages.get(t, "")] = skips.get(messages.get(t, ""), 0) + 1
  return {"counts": counts(outcomes), "failing": failing,
          "failure_messages": {t: messages.get(t, "") for t in failing},
          "skip_reasons": dict(sorted(skips.items(), key=lambda kv: -kv[1]))}


# --- the child ---------------------------------------------------------------


def child_env(mode: str, cpu: bool, devices: int, facts: pathlib.Path,
              base: dict[str, str] | None = None) -> dict[str, str]:
  """The environment of one pytest child (`base`: default os.environ).

  The plugin directory and the repository go first on PYTHONPATH (jax_llar
  need not be installed); JAX_LLAR_SWAP is set in swapped mode only. On CPU
  the platform is pinned and `devices` host devices are forced; elsewhere
  the platform is left as given.
  """
  env = dict(os.environ if base is None else base)
  env["PYTHONPATH"] = os.pathsep.join(
      [str(PLUGIN_DIR), str(REPO)] +
      ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
  env["JAX_LLAR_PEER_MODE"] = mode
  env["JAX_LLAR_PEER_FACTS"] = str(facts)
  env.pop("JAX_LLAR_SWAP", None)
  if mode == "swapped":
    env["JAX_LLAR_SWAP"] = "1"
  if cpu:
    env["JAX_PLATFORMS"] = "cpu"
    env["JAX_NUM_CPU_DEVICES"] = str(devices)
    env["XLA_FLAGS"] = " ".join(
        f for f in (env.get("XLA_FLAGS", ""),
                    f"--xla_force_host_platform_device_count={devices}") if f)
  return env


