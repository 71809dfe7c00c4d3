"""Host-device setup shared by the command-line tools (demo, bench)."""

from __future__ import annotations

import os


def gpu_present() -> bool:
  """True when this machine has an NVIDIA GPU device node and JAX may use it
  (JAX_PLATFORMS unset or naming cuda/gpu)."""
  nodes = any(os.path.exists(f"/dev/nvidia{i}") for i in range(16))
  return nodes and os.environ.get("JAX_PLATFORMS", "") in ("", "cuda", "gpu")


def force_host_devices(n: int) -> bool:
  """Asks XLA for `n` CPU devices (XLA_FLAGS), unless the flags already set a
  count. Must run before JAX initialises its backends; returns True when it
  added the flag."""
  flags = os.environ.get("XLA_FLAGS", "")
  if "xla_force_host_platform_device_count" in flags:
    return False
  os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()
  return True
