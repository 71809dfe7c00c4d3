"""Running the loopback tool from the one-GPU tests.

`run_tool` runs ``python -m jax_llar.tools.loopback``'s main function in
this process, with the tool's own flag parsing and validation, on the CUDA
context the suite already holds (conftest.py sets
CUDA_DEVICE_MAX_CONNECTIONS before it starts): a tool run then costs no
interpreter, JAX or CUDA start-up of its own. The fault modes still run
each case in a child process (a trap loses that process's context), as the
tool always does. A case that loses this process's context fails its test,
and the tests after it then fail with the reason the harness gives for
every case it cannot run.

With JAX_LLAR_GPU1_RESULTS=DIR, a run given a name (`run_tool`'s keep_as)
also copies its JSON record to DIR/<name>.json.

Also here: what the tests read from a record (`problems`, `passed`), and
`compare`, the child program that runs an LL128 algorithm and its LL twin
on the same inputs.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import os
import pathlib
import shutil
import subprocess
import sys

from jax_llar.tools.loopback.harness import MAX_CONNECTIONS, summary

ROOT = pathlib.Path(__file__).resolve().parents[2]
COMPARE = pathlib.Path(__file__).parent / "programs" / "compare_ll128.py"
# Skips the harness states for a reason that is no fault: not a whole number
# of elements; grids not co-resident on the one GPU.
ALLOWED_SKIPS = ("whole number", "co-resident")


def statuses(record) -> dict[str, int]:
  """Rows per status of a record."""
  return summary(record["rows"])


def run_tool(tmp_path, *args, keep_as: str | None = None):
  """Runs the loopback tool with `args`; returns (exit status, its JSON
  record or None, the tail of its output). With JAX_LLAR_GPU1_RESULTS=DIR
  and `keep_as`, the record is also copied to DIR/<keep_as>.json."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from jax_llar.tools.loopback import cli as loopback  # pylint: disable=g-import-not-at-top (defines flags)
  path = tmp_path / "loopback.json"
  if path.exists():
    path.unlink()
  flags.FLAGS.unparse_flags()
  flags.FLAGS(["loopback", f"--json={path}", *args])
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    rc = loopback.main()
  record = json.loads(path.read_text()) if path.exists() else None
  keep = os.environ.get("JAX_LLAR_GPU1_RESULTS")
  if keep and keep_as and path.exists():
    pathlib.Path(keep).mkdir(parents=True, exist_ok=True)
    shutil.copy(path, pathlib.Path(keep) / f"{keep_as}.json")
  return rc, record, out.getvalue()[-4000:]


def problems(record, allowed=ALLOWED_SKIPS):
  """Rows that neither passed nor were skipped for a reason `allowed` names."""
  return [r for r in record["rows"] if r["status"] != "pass" and not (
      r["status"] == "skipped" and any(w in r.get("reason", "") for w in allowed))]


def passed(record) -> set:
  """(world, dtype, bytes per rank, start epoch) of every row that passed."""
  return {(r["world_size"], r["dtype"], r["bytes_per_rank"], r["start_epoch"])
          for r in record["rows"] if r["status"] == "pass"}


def grid(worlds, dtypes, sizes, epochs) -> frozenset:
  """Every (world, dtype, bytes per rank, start epoch) of the product."""
  return frozenset(itertools.product(worlds, dtypes, sizes, epochs))


def compare(cases, calls, sync, seed=0, timeout=900,
            algorithms=("one_shot_ll", "one_shot_ll128")):
  """Runs the comparison child program (programs/compare_ll128.py) on
  `cases` ([world, dtype, bytes per rank, misalign, start epoch] each);
  returns its rows and the tail of its output."""
  env = dict(os.environ)
  env.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", MAX_CONNECTIONS)
  spec = {"cases": [list(c) for c in cases], "calls": calls, "sync": sync, "seed": seed,
          "algorithms": list(algorithms)}
  p = subprocess.run([sys.executable, str(COMPARE), json.dumps(spec)], cwd=ROOT,
                     capture_output=True, text=True, timeout=timeout, env=env)
  tail = (p.stdout + p.stderr)[-4000:]
  line = next((ln for ln in reversed(p.stdout.splitlines()) if ln.startswith("{")), None)
  assert line is not None, tail
  data = json.loads(line)
  assert "unavailable" not in data, data
  return data["rows"], tail
