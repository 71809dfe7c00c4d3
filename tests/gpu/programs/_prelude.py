"""What every GPU child program starts from (imported by path: the programs
folder is the first entry of sys.path when a program runs).

``mesh`` is a one-axis mesh ``x`` over all devices, ``x`` a float32 array of
1000 elements per rank sharded over it, ``psum_fn`` jax_llar.psum over
``x`` in a jitted shard_map, and ``emit`` prints the program's one JSON
line.
"""

from __future__ import annotations

import json
import sys

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_llar

mesh = Mesh(np.array(jax.devices()), ("x",))
sharding = NamedSharding(mesh, P("x"))
x = jax.device_put(np.arange(mesh.size * 1000, dtype=np.float32), sharding)


def shard_jit(fn):
  """``jax.jit(jax.shard_map(fn))`` over ``x``, rank r's block in and out."""
  return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                               check_vma=False))


psum_fn = shard_jit(lambda v: jax_llar.psum(v, "x"))


def fast() -> bool:
  """Whether any psum lowered so far took the fast path."""
  return any(d.fast for d in jax_llar.dispatch_log())


def emit(obj: dict) -> None:
  """Prints `obj` as the program's one JSON line (flushed: a trap may end
  the process at exit)."""
  print(json.dumps(obj, default=str), flush=True)
  sys.stdout.flush()
