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


def gpu_count() -> int:
  """The NVIDIA GPUs a process started here may see, without starting CUDA
  (a tool whose work runs in child processes decides with it before it
  starts them; JAX itself may still see fewer, and says why).

  The device nodes ``/dev/nvidia<N>``; with ``CUDA_VISIBLE_DEVICES`` set, at
  most its entries up to the first invalid one (as CUDA reads it: ``-1``
  or an empty value hides every GPU); 0 where `gpu_present` is False.
  """
  if not gpu_present():
    return 0
  nodes = sum(1 for name in os.listdir("/dev")
              if name.startswith("nvidia") and name[6:].isdigit())
  visible = os.environ.get("CUDA_VISIBLE_DEVICES")
  if visible is None:
    return nodes
  count = 0
  for entry in visible.split(","):
    entry = entry.strip()
    if not entry or entry.startswith("-"):
      break
    count += 1
  return min(count, nodes)


def devices_for(what: str, world: int = 0, cuda: bool = False) -> int:
  """The devices JAX gives this process, for a tool about to run `what` (an
  all-reduce over `world` of them; 0: all): their number, or the tool's one
  line of refusal. Starts JAX's backends.

  Raises:
    jax_llar.tools._cli.Refused: with fewer than 2 devices (or, with `cuda`,
      fewer than 2 CUDA GPUs), saying what `what` needs and what is here; or
      with a `world` above the devices present.
  """
  import jax
  from jax_llar.tools._cli import Refused
  devices = jax.devices()
  platform = devices[0].platform
  here = (f"{len(devices)} {'GPU' if platform == 'gpu' else platform.upper()} "
          f"device{'s' if len(devices) != 1 else ''}")
  if cuda and (platform != "gpu" or len(devices) < 2):
    raise Refused(f"{what} needs 2+ CUDA GPUs; this machine has {here}")
  if len(devices) < 2:
    hint = (" (JAX_PLATFORMS=cpu runs it on forced CPU devices)" if platform == "gpu"
            else "")
    raise Refused(f"{what} needs 2+ devices for an all-reduce; this machine has "
                  f"{here}{hint}")
  if world > len(devices):
    raise Refused(f"--world={world}: this machine has {here}")
  return world or len(devices)


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
