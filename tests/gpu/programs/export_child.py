"""Runs a serialized jax.export program (argv[1]) on argv[2] (.npy, rank r's
block in row r) in a process that never imports jax_llar; saves the output
to argv[3] and prints whether jax_llar was imported."""

from __future__ import annotations

import json
import sys

import jax
import numpy as np
from jax import export
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

with open(sys.argv[1], "rb") as f:
  exp = export.deserialize(bytearray(f.read()))
mesh = Mesh(np.array(jax.devices()), ("x",))
x = np.load(sys.argv[2])
out = exp.call(jax.device_put(x, NamedSharding(mesh, P("x"))))
np.save(sys.argv[3], np.asarray(out))
print(json.dumps({"jax_llar_imported": "jax_llar" in sys.modules}), flush=True)
