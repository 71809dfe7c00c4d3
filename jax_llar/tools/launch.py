"""One process per GPU on one node: start N copies of a Python program under
jax.distributed.

  python -m jax_llar.tools.launch --nproc 2 [--grace_s 30] -- script.py [args...]

Starts `--nproc` processes of python script.py args...; process i gets
GPU i (JAX_LOCAL_DEVICE_IDS=i), the coordinator address of a free local
port (JAX_COORDINATOR_ADDRESS, which jax.distributed reads) and its
index and the count (JAX_LLAR_PROCESS_ID, JAX_LLAR_NUM_PROCESSES).
The program calls `initialize` (or jax.distributed.initialize with those
values) before anything else of JAX. Each output line is prefixed with
[i]. When a process fails, the others get --grace_s seconds to end (in
jax_llar's bounded-wait error, if they were waiting for it) and are then
killed. A process fails when it ends at the OS level: a signal, a non-zero
exit status. Under jax.distributed a Python program that raises does not
end by itself: JAX's shutdown waits for every peer first. `initialize`
therefore makes an uncaught exception end the process at once, status 1,
after its traceback. A program that calls sys.exit(n) still goes through
JAX's shutdown; call os._exit(n) after flushing to fail at once. Exit
status: 0 when every process exited with 0, else the first failing
process's status (a signal N as 128 + N); 2 when no program is given. A
--grace_s that is not a finite number of seconds from 0 to 86400, or an
--nproc outside 1-256, is refused in one line before anything starts.

Without GPUs (JAX_PLATFORMS=cpu) each process gets one CPU device instead;
jax_llar then lowers every psum to lax.psum, which shows what GPUs would do.

Under SLURM, Open MPI or another launcher that jax.distributed.initialize
detects, no launcher of ours is needed: call jax.distributed.initialize()
with one local device per process (README: "One process per GPU").
"""

from __future__ import annotations

import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from absl import flags

from jax_llar.tools import _cli

_MAX_NPROC = 256
_MAX_GRACE_S = 86_400.0
# --nproc and --grace_s (see the module docstring).
NPROC = flags.DEFINE_integer("nproc", 2, "Processes to start, one GPU each.", lower_bound=1,
                             upper_bound=_MAX_NPROC)
GRACE_S = flags.DEFINE_float("grace_s", 30.0, "Seconds the other processes may run "
                             "on after one failed, before they are killed (a finite "
                             "number, 0-86400).", lower_bound=0, upper_bound=_MAX_GRACE_S)

# The variables the launcher gives each process (its index, the count);
# `initialize` reads them.
ENV_PROCESS_ID = "JAX_LLAR_PROCESS_ID"
ENV_NUM_PROCESSES = "JAX_LLAR_NUM_PROCESSES"


def initialize() -> None:
  """``jax.distributed.initialize`` for a process started by this launcher
  (reads ``JAX_LLAR_PROCESS_ID`` and ``JAX_LLAR_NUM_PROCESSES``; JAX reads
  ``JAX_COORDINATOR_ADDRESS`` and ``JAX_LOCAL_DEVICE_IDS`` itself).

  Also installs an exception hook: an uncaught exception prints its
  traceback and ends the process with status 1 at once (``os._exit``),
  instead of waiting in JAX's shutdown for every peer, so that the launcher
  sees the failure and its --grace_s applies.

  Raises:
    RuntimeError: the variables are not set (not started by the launcher).
  """
  import jax  # pylint: disable=g-import-not-at-top
  try:
    pid, n = int(os.environ[ENV_PROCESS_ID]), int(os.environ[ENV_NUM_PROCESSES])
  except (KeyError, ValueError):
    raise RuntimeError(f"{ENV_PROCESS_ID} and {ENV_NUM_PROCESSES} are not set: start "
                       "this program with python -m jax_llar.tools.launch") from None
  jax.distributed.initialize(num_processes=n, process_id=pid)
  previous = sys.excepthook

  def fail_at_once(kind, value, tb):
    try:
      previous(kind, value, tb)
    finally:
      sys.stdout.flush()
      sys.stderr.flush()
      os._exit(1)

  sys.excepthook = fail_at_once


def free_port() -> int:
  """A TCP port that was free on 127.0.0.1 a moment ago."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _pump(i: int, stream, out) -> None:
  for line in iter(stream.readline, ""):
    out.write(f"[{i}] {line}")
    out.flush()


def launch(nproc: int, argv: list[str], grace_s: float = 30.0,
           env: dict[str, str] | None = None) -> int:
  """Runs `nproc` processes of ``python argv...`` (see the module
  docstring); returns the exit status.

  Args:
    nproc: processes, one GPU each (1 or more).
    argv: the script and its arguments.
    grace_s: seconds the others may run on after a process failed (finite,
      0 or more).
    env: extra environment variables for every process.

  Raises:
    ValueError: for an nproc below 1, no program, or a grace_s that is
      negative or not finite (nan would never end the wait).
  """
  if nproc < 1 or not argv:
    raise ValueError("launch needs --nproc >= 1 and a program")
  if not (isinstance(grace_s, (int, float)) and math.isfinite(grace_s) and grace_s >= 0):
    raise ValueError(f"launch needs a finite grace_s >= 0 seconds, not {grace_s!r}")
  addr = f"127.0.0.1:{free_port()}"
  procs, pumps = [], []
  try:
    return _run(procs, pumps, nproc, argv, grace_s, env, addr)
  finally:
    # However the launcher ends (an exception, Ctrl-C, SIGTERM), no child
    # outlives it: a child waiting on a dead peer would hold its GPU.
    for p in procs:
      if p.poll() is None:
        p.kill()
    for p in procs:
      p.wait()
    for t in pumps:  # every line of output reaches stdout before we return
      t.join(10)


def _run(procs, pumps, nproc, argv, grace_s, env, addr) -> int:
  """launch's body: starts the children into `procs` (their output pumps
  into `pumps`) and waits for them."""
  for i in range(nproc):
    e = dict(os.environ, **(env or {}))
    e.update({"JAX_COORDINATOR_ADDRESS": addr, "JAX_LOCAL_DEVICE_IDS": str(i),
              ENV_PROCESS_ID: str(i), ENV_NUM_PROCESSES: str(nproc),
              "PYTHONUNBUFFERED": "1"})
    p = subprocess.Popen([sys.executable, *argv], env=e, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    procs.append(p)
    t = threading.Thread(target=_pump, args=(i, p.stdout, sys.stdout), daemon=True)
    t.start()
    pumps.append(t)
  first_failure, failed_at = None, None
  while any(p.poll() is None for p in procs):
    for i, p in enumerate(procs):
      rc = p.poll()
      if rc not in (None, 0) and first_failure is None:
        first_failure, failed_at = (i, rc), time.monotonic()
        print(f"[launch] process {i} exited with {rc}; the others have {grace_s:g} s",
              flush=True)
    if failed_at is not None and time.monotonic() - failed_at > grace_s:
      for i, p in enumerate(procs):
        if p.poll() is None:
          print(f"[launch] killing process {i}", flush=True)
          p.kill()
          p.wait()
    time.sleep(0.05)
  for p in procs:
    p.wait()
  for t in pumps:
    t.join(10)
  if first_failure is None:
    bad = [(i, p.returncode) for i, p in enumerate(procs) if p.returncode != 0]
    first_failure = bad[0] if bad else None
  if first_failure is None:
    return 0
  rc = first_failure[1]
  return 128 - rc if rc < 0 else rc


def main(argv: list[str]) -> int:
  """The tool's main (`_cli.run` with positional arguments): `argv` is the
  program and its arguments (after ``--``)."""
  if not argv:
    print("jax_llar.tools.launch: no program given; usage: python -m "
          "jax_llar.tools.launch --nproc N [--grace_s S] -- script.py [args...]",
          file=sys.stderr)
    return 2
  if not argv[0].startswith("-") and not os.path.isfile(argv[0]):
    raise _cli.Refused(f"no such program: {argv[0]}")
  return launch(NPROC.value, argv, GRACE_S.value)


def _terminate(signum, frame):  # SIGTERM: end like Ctrl-C, through launch's cleanup
  del frame
  raise SystemExit(128 + signum)


if __name__ == "__main__":
  signal.signal(signal.SIGTERM, _terminate)
  _cli.run(main, positional=True)
