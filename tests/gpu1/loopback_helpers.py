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
"""

from __future__ import annotations

import contextlib
import io
import json
import pathlib

from jax_llar.tools.loopback_harness import summary

ROOT = pathlib.Path(__file__).resolve().parents[2]


def statuses(record) -> dict[str, int]:
  """Rows per status of a record."""
  return summary(record["rows"])


def run_tool(tmp_path, *args):
  """Runs the loopback tool with `args`; returns (exit status, its JSON
  record or None, the tail of its output)."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from jax_llar.tools import loopback  # pylint: disable=g-import-not-at-top (defines flags)
  path = tmp_path / "loopback.json"
  if path.exists():
    path.unlink()
  flags.FLAGS.unparse_flags()
  flags.FLAGS(["loopback", f"--json={path}", *args])
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    rc = loopback.main()
  record = json.loads(path.read_text()) if path.exists() else None
  return rc, record, out.getvalue()[-4000:]
