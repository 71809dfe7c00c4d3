"""Host-platform setup for the command-line tools and examples.

JAX reads ``XLA_FLAGS`` when it starts its backends and ``JAX_PLATFORMS``
when it is imported (into its ``jax_platforms`` option), so these functions
must run before the first call that needs a device; `use_cpu` also sets the
option when jax is already imported.
"""

from __future__ import annotations

import os
import sys

_FORCE_FLAG = "--xla_force_host_platform_device_count"


def gpu_present() -> bool:
  """True when this machine has an NVIDIA device node and JAX may use it.

  Returns False when ``JAX_PLATFORMS`` is set to anything but ``cuda`` or
  ``gpu``; a device node without a working CUDA plugin still counts as
  present (JAX then says why it cannot use it).
  """
  nodes = any(os.path.exists(f"/dev/nvidia{i}") for i in range(16))
  return nodes and os.environ.get("JAX_PLATFORMS", "") in ("", "cuda", "gpu")


def force_host_devices(n: int) -> bool:
  """Asks XLA for `n` CPU devices through ``XLA_FLAGS``.

  Leaves ``XLA_FLAGS`` alone when it already sets a device count. Returns
  True when it added the flag.
  """
  flags = os.environ.get("XLA_FLAGS", "")
  if _FORCE_FLAG.lstrip("-") in flags:
    return False
  os.environ["XLA_FLAGS"] = f"{flags} {_FORCE_FLAG}={n}".strip()
  return True


def use_cpu(n: int) -> list[str]:
  """Runs JAX on `n` forced CPU devices when no GPU is usable.

  Sets ``JAX_PLATFORMS=cpu`` (when unset: with the CUDA plugin installed but
  no GPU, JAX would otherwise print a plugin-configuration traceback) and the
  forced device count. Returns one line per variable it set, for the caller
  to print; an empty list when it changed nothing.
  """
  changed = []
  if not os.environ.get("JAX_PLATFORMS"):
    os.environ["JAX_PLATFORMS"] = "cpu"
    if "jax" in sys.modules:  # imported already: its option was read from the environment
      sys.modules["jax"].config.update("jax_platforms", "cpu")
    changed.append("JAX_PLATFORMS=cpu")
  if force_host_devices(n):
    changed.append(f"XLA_FLAGS={os.environ['XLA_FLAGS']}")
  return changed


def gpu_memory_used_mib() -> list[int] | None:
  """Device memory in use per GPU, MiB, as ``nvidia-smi`` reports it (every
  allocation of every process: XLA's pool, NCCL's buffers, jax_llar's
  regions, loaded modules); None where nvidia-smi is missing or fails.
  Long tools print it with their progress, so that growth shows."""
  import subprocess
  try:
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used",
                          "--format=csv,noheader,nounits"], capture_output=True,
                         text=True, timeout=10, check=True).stdout
    return [int(v) for v in out.split()]
  except (OSError, subprocess.SubprocessError, ValueError):
    return None


def memory_note() -> str:
  """``"; GPU memory used 1234/1200 MiB"`` for a progress line, or ``""``."""
  used = gpu_memory_used_mib()
  return f"; GPU memory used {'/'.join(str(u) for u in used)} MiB" if used else ""
