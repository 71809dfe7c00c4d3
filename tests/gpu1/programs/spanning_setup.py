"""Child program: creating a communicator set whose group spans processes,
when the other process never joins or cannot join.

    python tests/gpu1/programs/spanning_setup.py absent SETUP_TIMEOUT_MS ATTEMPTS
    python tests/gpu1/programs/spanning_setup.py same_gpu SETUP_TIMEOUT_MS
    python tests/gpu1/programs/spanning_setup.py peer SETUP_TIMEOUT_MS UNIQUE_ID_HEX

``absent``: this process holds rank 0 of a 2-rank group on its first CUDA
device, with a fresh NCCL unique id per attempt (``nccl_unique_id``), and
nobody ever holds rank 1. Each attempt calls the native
``create_comm_set_of_ranks`` with the bound and records what it raised,
how long it took, and, after it, the device memory in use (the driver's
count, cuMemGetInfo in the device's primary context) and this process's
thread count.

``same_gpu``: rank 0 here, rank 1 in a second process (mode ``peer``) on the
same device, which NCCL refuses (two ranks of one communicator on one GPU);
both processes must end in an error, NCCL's or the bound's.

Prints one JSON line: ``{"attempts": [{"error", "seconds", "used_mib",
"threads"}, ...], "baseline_used_mib", "baseline_threads", "nccl"}`` (in
``same_gpu`` also ``"peer"``, the peer's line), or ``{"unavailable": why}``.
Runs in a child process: NCCL's bootstrap root thread of each unique id
stays behind, blocked, for the life of the process.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import time


def used_mib(ordinal: int) -> float:
  """Device memory in use on CUDA device `ordinal` (total - free, MiB), in
  its primary context."""
  cuda = ctypes.CDLL("libcuda.so.1")
  dev, ctx, prev = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p()
  free, total = ctypes.c_size_t(), ctypes.c_size_t()
  assert cuda.cuDeviceGet(ctypes.byref(dev), ordinal) == 0
  assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
  assert cuda.cuCtxPushCurrent_v2(ctx) == 0
  assert cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)) == 0
  assert cuda.cuCtxPopCurrent_v2(ctypes.byref(prev)) == 0
  assert cuda.cuDevicePrimaryCtxRelease_v2(dev) == 0
  return (total.value - free.value) / 2**20


def threads() -> int:
  """This process's threads (NCCL's set-up threads included)."""
  return len(os.listdir("/proc/self/task"))


def attempt(mod, ordinal: int, rank: int, uid: bytes, setup_ms: int) -> dict:
  """One call of create_comm_set_of_ranks for `rank` of 2 on `ordinal`."""
  start = time.monotonic()
  error = None
  try:
    mod.create_comm_set_of_ranks([(2, [rank], [ordinal], uid)], 1_000_000_000, setup_ms)
  except RuntimeError as e:
    error = str(e)
  return {"error": error, "seconds": time.monotonic() - start,
          "used_mib": used_mib(ordinal), "threads": threads()}


def main(argv: list[str]) -> int:
  if len(argv) < 3 or argv[1] not in ("absent", "same_gpu", "peer"):
    print(__doc__, file=sys.stderr)
    return 2
  mode, setup_ms = argv[1], int(argv[2])
  import jax  # pylint: disable=g-import-not-at-top
  from jax_llar import _ext  # pylint: disable=g-import-not-at-top
  mod = _ext.load(quiet=True)
  if mod is None:
    print(json.dumps({"unavailable": _ext.reason()}), flush=True)
    return 0
  ordinal = jax.devices("cuda")[0].local_hardware_id
  out = {"nccl": mod.nccl_runtime_version(), "baseline_used_mib": used_mib(ordinal),
         "baseline_threads": threads(), "attempts": []}
  if mode == "absent":
    for _ in range(int(argv[3])):
      out["attempts"].append(attempt(mod, ordinal, 0, mod.nccl_unique_id(), setup_ms))
  elif mode == "peer":
    out["attempts"].append(attempt(mod, ordinal, 1, bytes.fromhex(argv[3]), setup_ms))
  else:
    uid = mod.nccl_unique_id()  # its bootstrap root lives in this process
    peer = subprocess.Popen([sys.executable, __file__, "peer", str(setup_ms), uid.hex()],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out["attempts"].append(attempt(mod, ordinal, 0, uid, setup_ms))
    try:
      text, _ = peer.communicate(timeout=setup_ms / 1000 + 120)
    except subprocess.TimeoutExpired:
      peer.kill()
      text, _ = peer.communicate()
    line = next((ln for ln in reversed(text.splitlines()) if ln.startswith("{")), None)
    out["peer"] = json.loads(line) if line else {"output_tail": text[-3000:],
                                                 "returncode": peer.returncode}
  print(json.dumps(out), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
