"""What jax_llar can do in this process, and what went wrong."""

from __future__ import annotations

from typing import Any

from jax_llar import _ext, comm
from jax_llar.config import settings


def status() -> dict[str, Any]:
  """Describes the fast path in this process.

  Returns:
    dict with ``built`` (extension compiled), ``active`` (extension loaded and
    usable), ``reason`` (why not, or None), ``nccl_runtime`` and
    ``nccl_compiled`` (NCCL_VERSION_CODE values, or None), ``nccl_library``
    (path), ``comm_sets`` (list of dicts: id, groups of CUDA ordinals,
    world size, scratch bytes per device) and ``settings``.
  """
  mod = _ext.load()
  return {
      "built": _ext.built(),
      "active": mod is not None,
      "reason": _ext.reason() if mod is None else None,
      "nccl_runtime": mod.nccl_runtime_version() if mod else None,
      "nccl_compiled": mod.nccl_compiled_version() if mod else None,
      "nccl_library": _ext.nccl_library_path() if mod else None,
      "comm_sets": [
          {"comm_id": c.comm_id, "groups": c.groups, "world_size": c.world_size,
           "scratch_bytes_per_device": c.scratch_bytes}
          for c in comm.comm_sets()
      ],
      "settings": vars(settings).copy(),
  }


def error_reports() -> list[dict[str, Any]]:
  """Timeout reports of the bounded device-side waits.

  A wait that exceeds ``settings.timeout_ms`` writes (rank, peer, block, line,
  epoch, flags seen) to host-mapped memory and traps, which fails the XLA
  call. Call this after catching the error to see what the kernel waited
  for. Returns an empty list when nothing timed out or the extension is not
  loaded.
  """
  mod = _ext.load()
  return list(mod.error_reports()) if mod else []
