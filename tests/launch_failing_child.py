"""Child of tests/test_distributed.py (not a test file): one of two CPU
processes started by python -m jax_llar.tools.launch. Process 1 raises right
after jax.distributed starts; process 0 would run for 120 s. The launcher
must see process 1 fail at once and stop process 0 after its grace period."""

from __future__ import annotations

import os
import time

os.environ["JAX_PLATFORMS"] = "cpu"

from jax_llar.tools import launch  # noqa: E402

launch.initialize()

import jax  # noqa: E402

print(f"started {jax.process_index()}", flush=True)
if jax.process_index() == 1:
  raise RuntimeError("process 1 fails on purpose")
time.sleep(120)
