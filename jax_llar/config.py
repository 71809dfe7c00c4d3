"""Run-time settings of jax_llar, read from the environment at import.

Every setting can also be changed from Python before the first lowering that
uses it (``jax_llar.config.settings.timeout_ms = 2000``). Changes apply to
programs lowered afterwards; compiled programs keep what they were built with.

Environment variables:
  JAX_LLAR_DISABLE=1        never use the fast path (every psum is lax.psum).
  JAX_LLAR_TIMEOUT_MS=N     bound on every device-side wait, milliseconds
                            (default 10000). A wait that runs out fails the
                            call with a report of rank, slot and epoch.
  JAX_LLAR_MAX_BYTES=N      largest per-rank payload (bytes) given to the fast
                            path (default and cap: the one-shot LL limit,
                            262144 bytes).
"""

from __future__ import annotations

import dataclasses
import os

ONE_SHOT_LIMIT_BYTES = 64 * 512 * 8  # ffi/include/llar/args.h: kOneShotMaxBytes


def _env_int(name: str, default: int) -> int:
  raw = os.environ.get(name)
  if raw is None or raw == "":
    return default
  try:
    return int(raw)
  except ValueError as e:
    raise ValueError(f"{name} must be an integer, got {raw!r}") from e


@dataclasses.dataclass
class Settings:
  """Mutable settings; see the module docstring."""
  disabled: bool = False
  timeout_ms: int = 10_000
  max_bytes: int = ONE_SHOT_LIMIT_BYTES


def _from_env() -> Settings:
  s = Settings(
      disabled=os.environ.get("JAX_LLAR_DISABLE", "") not in ("", "0"),
      timeout_ms=_env_int("JAX_LLAR_TIMEOUT_MS", 10_000),
      max_bytes=min(_env_int("JAX_LLAR_MAX_BYTES", ONE_SHOT_LIMIT_BYTES),
                    ONE_SHOT_LIMIT_BYTES),
  )
  if s.timeout_ms <= 0:
    raise ValueError("JAX_LLAR_TIMEOUT_MS must be positive")
  return s


settings = _from_env()
