"""Run-time settings of jax_llar, read from the environment at import.

Every setting can also be changed from Python
(``jax_llar.config.settings.disabled = True``). Each change is part of jit's
cache keys (a JAX user context), so a jitted function is lowered again on
its next call; an executable already held (``jax.jit(f).lower(x).compile()``)
keeps what it was built with. ``timeout_ms`` applies to communicator sets
created afterwards.

Environment variables:
  JAX_LLAR_DISABLE=1        never use the fast path (every psum is lax.psum);
                            1/true/yes/on or 0/false/no/off.
  JAX_LLAR_SWAP=1           at import, swap every psum of the process for
                            jax_llar's dispatch (``jax_llar.install()``).
  JAX_LLAR_TIMEOUT_MS=N     bound on every device-side wait, milliseconds
                            (default 30000). A wait that runs out fails the
                            call with a report of rank, slot and epoch, and
                            the CUDA context of that device is lost (the
                            process must restart). Fixed per communicator set
                            when the set is created (first fast-path lowering
                            for a device layout).
  JAX_LLAR_ALGORITHM=NAME   "auto" (default: the tuning table decides) or an
                            algorithm's short name (``jax_llar.Algorithm``,
                            e.g. "one_shot_ll"): that algorithm serves every
                            psum it can, whatever the table says. The only
                            way to run a non-deterministic algorithm
                            (``jax_llar.algorithms.NON_DETERMINISTIC``, e.g.
                            "two_shot_ll128_atomic"), which no table chooses.
  JAX_LLAR_MAX_BYTES=N      largest per-rank payload (bytes) given to the fast
                            path, 0 .. 4194304 (the cap: the largest payload
                            any algorithm serves,
                            ``jax_llar.algorithms.LARGEST_MAX_BYTES``); larger
                            values are clipped to the cap. Default: the cap
                            (``DEFAULT_MAX_BYTES``), so that the tuning
                            tables and a forced algorithm decide up to their
                            own limits; a smaller value caps both.
  JAX_LLAR_TUNING_FILE=PATH a tuning table file (``jax_llar.tuning``) that
                            serves its architecture and number of ranks ahead
                            of the tuning directory and the tables shipped
                            with jax_llar (default: none).
  JAX_LLAR_TUNING_DIR=PATH  the directory of this machine's tuning tables,
                            written by ``python -m jax_llar.tools.tune``
                            (default ~/.cache/jax_llar/tuning); a table there
                            serves ahead of the shipped one.
  JAX_LLAR_SIGNATURES=0     turn the call signatures off (default on): every
                            fast-path call then carries signature 0, so a
                            mispaired call of a signed algorithm is no longer
                            detected (``jax_llar.signature``).
"""

from __future__ import annotations

import dataclasses
import numbers
import os

import jax

from jax_llar.algorithms import LARGEST_MAX_BYTES, Algorithm

# The cap of max_bytes (bytes per rank).
MAX_BYTES_CAP = LARGEST_MAX_BYTES
# The default of max_bytes: the cap, so that the tuning tables (each row
# within its algorithm's MAX_BYTES) and a forced algorithm decide by
# themselves; the default rule stops at the one-shot's limit.
DEFAULT_MAX_BYTES = MAX_BYTES_CAP
# The default of tuning_dir (``~`` is expanded where the directory is read).
DEFAULT_TUNING_DIR = os.path.join("~", ".cache", "jax_llar", "tuning")


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def env_bool(name: str, default: bool = False) -> bool:
  """The boolean environment variable `name` (unset or empty: `default`).

  Raises:
    ValueError: a value other than 1/true/yes/on, 0/false/no/off or empty.
  """
  raw = os.environ.get(name, "").strip().lower()
  if raw == "":
    return default
  if raw in _TRUE:
    return True
  if raw in _FALSE:
    return False
  raise ValueError(f"{name} must be one of {_TRUE + _FALSE[1:]}, got {raw!r}")


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
  """Mutable settings; see the module docstring. Assignments are checked.

  Attributes:
    disabled: True: every psum lowers to lax.psum.
    timeout_ms: bound on every device-side wait, milliseconds (> 0); applies
      to communicator sets created afterwards (a set is created once per
      device layout and kept).
    max_bytes: largest per-rank payload in bytes for the fast path,
      0 .. MAX_BYTES_CAP, default DEFAULT_MAX_BYTES (0 sends every psum to
      lax.psum).
    algorithm: "auto" (the tuning table decides) or the short name of the
      algorithm that serves every psum it can (``forced()`` gives it).
    tuning_file: path of a tuning table that serves its architecture and
      number of ranks ahead of every other table, or "" (none).
    tuning_dir: directory of this machine's tuning tables (``~`` allowed).
    signatures: True (default): every fast-path call carries its call
      signature (``jax_llar.signature``), so that a mispaired call of a
      signed algorithm ends in an error, never in a wrong sum; False: every
      call carries 0.

  Raises:
    ValueError: on assignment of an out-of-range value.
  """
  disabled: bool = False
  timeout_ms: int = 30_000
  max_bytes: int = DEFAULT_MAX_BYTES
  algorithm: str = "auto"
  tuning_file: str = ""
  tuning_dir: str = DEFAULT_TUNING_DIR
  signatures: bool = True

  def __setattr__(self, name, value):
    if name == "algorithm":
      names = ["auto"] + [a.short_name for a in Algorithm]
      if value not in names:
        raise ValueError(f"algorithm must be one of {names}, got {value!r}")
    if name in ("timeout_ms", "max_bytes"):
      if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise ValueError(f"{name} must be an int, got {value!r}")
      value = int(value)
    if name == "timeout_ms" and value <= 0:
      raise ValueError(f"timeout_ms must be a positive int (milliseconds), got {value!r}")
    if name == "max_bytes" and not 0 <= value <= MAX_BYTES_CAP:
      raise ValueError(f"max_bytes must be an int in 0..{MAX_BYTES_CAP}, got {value!r}")
    if name in ("tuning_file", "tuning_dir"):
      if not isinstance(value, (str, os.PathLike)):
        raise ValueError(f"{name} must be a path (str), got {value!r}")
      value = os.fspath(value)
    if name == "tuning_dir" and not value:
      raise ValueError("tuning_dir must not be empty")
    if name in ("disabled", "signatures"):
      if not isinstance(value, (bool, numbers.Integral)):
        raise ValueError(f"{name} must be a bool, got {value!r}")
      value = bool(value)
    super().__setattr__(name, value)
    # Every change is part of jit's cache keys: programs lowered before it
    # are lowered again on their next call.
    _generation.set_global(_generation.get_global() + 1)

  def forced(self) -> Algorithm | None:
    """The algorithm `algorithm` names, or None for "auto"."""
    if self.algorithm == "auto":
      return None
    return Algorithm.from_short_name(self.algorithm)


# Bumped by every assignment to a setting; a JAX user context, so part of
# jit's tracing, lowering and compilation cache keys.
_generation = jax.make_user_context(default_value=0)


def _from_env() -> Settings:
  try:
    return Settings(
        disabled=env_bool("JAX_LLAR_DISABLE"),
        timeout_ms=_env_int("JAX_LLAR_TIMEOUT_MS", 30_000),
        max_bytes=min(_env_int("JAX_LLAR_MAX_BYTES", DEFAULT_MAX_BYTES),
                      MAX_BYTES_CAP),
        algorithm=os.environ.get("JAX_LLAR_ALGORITHM", "").strip() or "auto",
        tuning_file=os.environ.get("JAX_LLAR_TUNING_FILE", "").strip(),
        tuning_dir=(os.environ.get("JAX_LLAR_TUNING_DIR", "").strip()
                    or DEFAULT_TUNING_DIR),
        signatures=env_bool("JAX_LLAR_SIGNATURES", default=True),
    )
  except ValueError as e:
    raise ValueError(f"jax_llar settings from the environment: {e}") from None


# The process's settings (a `Settings`), read from the JAX_LLAR_* environment
# variables at import; assign an attribute to change one (validated). Lowerings
# read them, so jitted functions are lowered again after a change.
settings = _from_env()
