"""Child program of the graph check: runs a chain and profiles it.

    python -m jax_llar.tools.programs.graph_child TRACE_DIR IMPL

IMPL is ``llar`` (jax_llar.psum) or ``copy`` (the copy custom call). Builds a
jitted shard_map chain of 64 steps ``x = op(x) * (axis_index + 1) * 0.25``
over all devices on float32 (1024 elements per rank), runs it three times,
then five more times under ``jax.profiler.trace(TRACE_DIR)``. IMPL
``loopback`` runs the same chain on the first device alone, the all-reduce
a loopback group's (2 simulated ranks, x of shape (2, 1024), row r scaled by
r + 1). XLA's dump
goes wherever ``XLA_FLAGS`` says (the parent sets ``--xla_dump_to``).

Prints one JSON line: ``{"impl", "devices", "platform", "decisions" (impl
name of each lowering decision), "fast" (any on the fast path),
"trace_error" (None, or why the profiler failed: the dump is the primary
evidence)}``; with fewer than 2 devices ``{"impl", "devices", "platform",
"error"}`` and exit status 3, before compiling anything.
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
  if len(argv) != 3 or argv[2] not in ("llar", "copy", "loopback"):
    print(__doc__, file=sys.stderr)
    return 2
  trace_dir, impl = argv[1], argv[2]
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax import lax
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

  import jax_llar
  from jax_llar.tools import copy as copy_call

  if impl == "loopback":
    return _loopback(trace_dir)
  mesh = Mesh(np.array(jax.devices()), ("x",))
  if mesh.size < 2:  # one rank: jax_llar leaves the psum to lax.psum, no custom call
    print(json.dumps({"impl": impl, "devices": mesh.size,
                      "platform": mesh.devices.flat[0].platform,
                      "error": "needs 2+ devices"}))
    return 3
  op = copy_call.copy if impl == "copy" else (lambda v: jax_llar.psum(v, "x"))

  def body(x):
    f = (lax.axis_index("x") + 1).astype(x.dtype)
    for _ in range(64):
      x = op(x) * f * 0.25
    return x

  fn = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                             check_vma=False))
  x = jax.device_put(jnp.ones(1024 * mesh.size, jnp.float32), NamedSharding(mesh, P("x")))
  trace_error = _run_and_profile(fn, x, trace_dir)
  decisions = jax_llar.dispatch_log()
  print(json.dumps({"impl": impl, "devices": mesh.size,
                    "platform": mesh.devices.flat[0].platform,
                    "decisions": [d.impl for d in decisions],
                    "fast": any(d.fast for d in decisions),
                    "trace_error": trace_error}))
  return 0


def _run_and_profile(fn, x, trace_dir: str) -> str | None:
  """Runs fn(x) three times, then five more under jax.profiler.trace;
  returns None, or why the profiler failed (the dump is the primary
  evidence)."""
  import jax
  for _ in range(3):
    fn(x).block_until_ready()
  try:
    with jax.profiler.trace(trace_dir):
      for _ in range(5):
        fn(x).block_until_ready()
    return None
  except Exception as e:  # noqa: BLE001 - the dump is the primary evidence
    return f"{type(e).__name__}: {e}"


def _loopback(trace_dir: str) -> int:
  """The chain on one device through a loopback group of 2 ranks."""
  import jax
  import jax.numpy as jnp
  from jax_llar.tools.loopback.group import LoopbackGroup

  device = jax.devices()[0]
  with LoopbackGroup(2, device=device) as g:
    def body(x):
      f = jnp.arange(1, 3, dtype=x.dtype)[:, None]
      for _ in range(64):
        x = g.psum(x) * f * 0.25
      return x
    fn = jax.jit(body)
    x = jax.device_put(jnp.ones((2, 1024), jnp.float32), device)
    trace_error = _run_and_profile(fn, x, trace_dir)
    records = [r["code"] for r in g.records()]
  print(json.dumps({"impl": "loopback", "devices": 1, "platform": device.platform,
                    "decisions": ["loopback.one_shot_ll"], "fast": True,
                    "error_codes": records, "trace_error": trace_error}))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
