"""Child of tests/test_distributed.py (not a test file): one of two CPU
processes under jax.distributed, started by python -m jax_llar.tools.launch.
Runs the set bootstrap and a region agreement (both stages) of
jax_llar.distributed through the real key-value store, with the fake native
module of the test, and prints one JSON line."""

from __future__ import annotations

import json
import os
import sys

os.environ["JAX_PLATFORMS"] = "cpu"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from jax_llar.tools import launch  # noqa: E402

launch.initialize()

import jax  # noqa: E402

from jax_llar import agreement, distributed  # noqa: E402
import test_distributed as td  # noqa: E402

groups = [[(0, 0), (1, 1)]]  # (process, device id)
kv = agreement.store()
me = jax.process_index()
native = td.Native()
comm_id, order = distributed.create(native, kv, groups, me,
                                    distributed.decision_record(2, None), 1000,
                                    {me: 0}, timeout_ms=30000)
agree = distributed.region_agreement(kv, distributed.set_key(groups), 1, [[0, 1]], order, me,
                                     timeout_ms=30000)
print(json.dumps({"me": me, "processes": jax.process_count(), "comm_id": comm_id,
                  "order": order, "spec": [native.specs[0][0], native.specs[0][1]],
                  "uid": native.specs[0][3].hex(),
                  "agree": [agree(0, distributed.ALLOCATED, ""),
                            agree(0, distributed.REGISTERED, "")]}))
