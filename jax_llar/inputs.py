"""What a lowering decision reads besides the program: the decision inputs.

Two processes whose inputs are equal decide alike for every psum of the same
program (jax_llar.dispatch.decide is a function of the program, these inputs
and the devices); processes of a group that spans processes agree on them
before they create its communicators (jax_llar.distributed).
"""

from __future__ import annotations

import os
import re
from typing import Any

from jax_llar import _ext, table_lookup, tuning
from jax_llar.config import settings

# XLA's concurrent command-buffer scheduling: graph nodes ordered only by
# declared buffer uses, so two independent all-reduces could overlap on one
# GPU and share a communicator's epoch counters (the fast path refuses it).
CONCURRENT_SCHEDULING = re.compile(
    r"xla_gpu_command_buffer_scheduling_mode\s*=\s*CONCURRENT", re.I)


def concurrent_scheduling() -> bool:
  """Whether ``XLA_FLAGS`` asks for concurrent command-buffer scheduling."""
  return bool(CONCURRENT_SCHEDULING.search(os.environ.get("XLA_FLAGS", "")))


def decision_inputs(world: int, architecture: str | None) -> dict[str, Any]:
  """Every input of a lowering decision besides the program, for a group of
  `world` ranks on GPUs of `architecture`: the settings, the tuning table
  that applies, the XLA flag the decision reads, the NCCL runtime and the
  extension's build. Equal inputs give equal decisions.

  Raises:
    jax_llar.tuning.TuningTableError: the tuning table is a broken file.
  """
  table = table_lookup.lookup(architecture, world).table
  mod = _ext.loaded()
  return {
      "disabled": bool(settings.disabled),
      "max_bytes": int(settings.max_bytes),
      "algorithm": settings.algorithm,
      "signatures": bool(settings.signatures),
      "timeout_ms": int(settings.timeout_ms),
      "table": None if table is None else tuning.dumps(tuning.to_dict(table)),
      "concurrent_flag": concurrent_scheduling(),
      "nccl": mod.nccl_runtime_version() if mod is not None else None,
      "extension": _ext.build_info(),
  }
