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

One rule for every value, from the environment and from Python alike:
surrounding whitespace is removed (``str.strip``), and a value that is empty
then (whitespace only) means unset, i.e. the setting's default. Integers are
decimal ASCII digits (``0``-``9``: no sign, no ``_``, no other script's
digits). A value the checks refuse raises ValueError; from the environment
its message starts with ``ENV_PREFIX`` (``"jax_llar settings from the
environment: "``) and names the variable. The numeric settings are bounded
by what the native side accepts (``jax_llar.native_bounds``): ``timeout_ms`` in
1 .. `TIMEOUT_MS_MAX`. Assigning an attribute that is no setting raises
AttributeError naming the settings.
"""

from __future__ import annotations

import dataclasses
import difflib
import numbers
import os
import re
from typing import Any

import jax
import numpy as np

from jax_llar.algorithms import LARGEST_MAX_BYTES, Algorithm
from jax_llar.native_bounds import native_range

# The cap of max_bytes (bytes per rank).
MAX_BYTES_CAP = LARGEST_MAX_BYTES
# The default of max_bytes: the cap, so that the tuning tables (each row
# within its algorithm's MAX_BYTES) and a forced algorithm decide by
# themselves; the default rule stops at the one-shot's limit.
DEFAULT_MAX_BYTES = MAX_BYTES_CAP
# The default of tuning_dir (``~`` is expanded where the directory is read).
DEFAULT_TUNING_DIR = os.path.join("~", ".cache", "jax_llar", "tuning")

# The largest timeout_ms, (2**64 - 1) // 1_000_000 = 18446744073709 (about 584
# years): its nanoseconds must fit create_comm_set's uint64_t timeout_ns.
TIMEOUT_MS_MAX = native_range("timeout_ms")[1]

# What the settings accept, per numeric setting: (least, largest), each
# within `native_range` (checked below, at import).
_NUMERIC = {"timeout_ms": (1, TIMEOUT_MS_MAX), "max_bytes": (0, MAX_BYTES_CAP)}
for _name, (_lo, _hi) in _NUMERIC.items():
  _nlo, _nhi = native_range(_name)
  if not _nlo <= _lo <= _hi <= _nhi:
    raise ImportError(f"jax_llar.config: {_name} accepts {_lo}..{_hi}, outside "
                      f"{_nlo}..{_nhi}, what the native side takes")
del _name, _lo, _hi, _nlo, _nhi

_UNITS = {"timeout_ms": "milliseconds", "max_bytes": "bytes per rank"}
_BOOLEAN = ("disabled", "signatures")
_PATHS = ("tuning_file", "tuning_dir")
# The string settings and the value an empty one means (its default).
_TEXT_DEFAULTS = {"algorithm": "auto", "tuning_file": "", "tuning_dir": DEFAULT_TUNING_DIR}

# --- the environment ----------------------------------------------------------------

# How every error about an environment variable starts.
ENV_PREFIX = "jax_llar settings from the environment: "

# Setting -> its environment variable.
_VARIABLES = {
    "disabled": "JAX_LLAR_DISABLE",
    "timeout_ms": "JAX_LLAR_TIMEOUT_MS",
    "max_bytes": "JAX_LLAR_MAX_BYTES",
    "algorithm": "JAX_LLAR_ALGORITHM",
    "tuning_file": "JAX_LLAR_TUNING_FILE",
    "tuning_dir": "JAX_LLAR_TUNING_DIR",
    "signatures": "JAX_LLAR_SIGNATURES",
}

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_DIGITS = re.compile(r"[0-9]+")


def _shown(raw: str, limit: int = 60) -> str:
  """`raw` for a message: its repr, cut to about `limit` characters."""
  return repr(raw) if len(raw) <= limit else repr(raw[:limit]) + f"... ({len(raw)} characters)"


def _env_value(name: str) -> tuple[str, str] | None:
  """(raw, stripped) value of the variable `name`; None when it is unset or
  whitespace only (both mean unset)."""
  raw = os.environ.get(name)
  if raw is None or not raw.strip():
    return None
  return raw, raw.strip()


def _parse_bool(raw: str, text: str) -> bool:
  low = text.lower() if text.isascii() else text
  if low in _TRUE:
    return True
  if low in _FALSE:
    return False
  raise ValueError(f"must be one of {', '.join(_TRUE + _FALSE)} (or empty), "
                   f"got {_shown(raw)}")


def env_bool(name: str, default: bool = False) -> bool:
  """The boolean environment variable `name` (unset, empty or whitespace
  only: `default`); 1/true/yes/on or 0/false/no/off, any case, surrounding
  whitespace ignored.

  Raises:
    ValueError: any other value; the message starts with `ENV_PREFIX` and
      names the variable.
  """
  found = _env_value(name)
  if found is None:
    return default
  try:
    return _parse_bool(*found)
  except ValueError as e:
    raise ValueError(f"{ENV_PREFIX}{name}: {e}") from None


def _parse_int(setting: str, raw: str, text: str) -> int:
  """The integer of `text` (ASCII digits) for `setting`; max_bytes above
  the cap is clipped to it, anything else out of range refused."""
  lo, hi = _NUMERIC[setting]
  if not _DIGITS.fullmatch(text):
    raise ValueError(f"must be a decimal integer (ASCII digits 0-9), got {_shown(raw)}")
  digits = text.lstrip("0") or "0"
  # No int() of an arbitrarily long string: more digits than the bound has
  # is above it.
  value = int(digits) if len(digits) <= len(str(hi)) else hi + 1
  if value > hi and setting == "max_bytes":
    return hi  # documented: clipped to the cap
  if not lo <= value <= hi:
    raise ValueError(_range_problem(setting, _shown(raw)))
  return value


def _range_problem(name: str, shown: str) -> str:
  lo, hi = _NUMERIC[name]
  why = ""
  if name == "timeout_ms":
    why = "; the native side takes it in nanoseconds, as a uint64_t"
  return f"{name} must be an int in {lo}..{hi} ({_UNITS[name]}{why}), got {shown}"


# --- the checks ---------------------------------------------------------------------


def _unknown(name: str) -> AttributeError:
  known = [f.name for f in dataclasses.fields(Settings)]
  close = difflib.get_close_matches(name, known, n=1)
  hint = f" (did you mean {close[0]!r}?)" if close else ""
  return AttributeError(f"jax_llar settings have no setting {name!r}{hint}; the "
                        f"settings are: {', '.join(known)}")


def _checked(name: str, value: Any) -> Any:
  """`value` as setting `name` holds it.

  Raises:
    AttributeError: `name` is no setting.
    ValueError: a value of the wrong kind or out of range.
  """
  if name in _NUMERIC:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
      raise ValueError(f"{name} must be an int, got {value!r}")
    value = int(value)
    lo, hi = _NUMERIC[name]
    if not lo <= value <= hi:
      raise ValueError(_range_problem(name, repr(value)))
    return value
  if name in _BOOLEAN:
    if isinstance(value, (bool, np.bool_)):
      return bool(value)
    if isinstance(value, numbers.Integral) and int(value) in (0, 1):
      return bool(value)
    raise ValueError(f"{name} must be a bool, got {value!r}")
  if name in _TEXT_DEFAULTS:
    if name in _PATHS and isinstance(value, os.PathLike):
      value = os.fspath(value)
    if not isinstance(value, str):
      kind = "a path (str)" if name in _PATHS else "a str"
      raise ValueError(f"{name} must be {kind}, got {value!r}")
    if "\0" in value:
      raise ValueError(f"{name} must not contain a NUL character, got {_shown(value)}")
    value = value.strip() or _TEXT_DEFAULTS[name]  # whitespace only: unset
    if name == "algorithm":
      names = ["auto"] + [a.short_name for a in Algorithm]
      if value not in names:
        raise ValueError(f"algorithm must be one of {names}, got {value!r}")
    return value
  raise _unknown(name)


@dataclasses.dataclass
class Settings:
  """Mutable settings; see the module docstring. Assignments are checked.

  Attributes:
    disabled: True: every psum lowers to lax.psum.
    timeout_ms: bound on every device-side wait, milliseconds, 1 ..
      `TIMEOUT_MS_MAX`; applies to communicator sets created afterwards (a
      set is created once per device layout and kept).
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

  String values are stripped of surrounding whitespace, and an empty one
  means the setting's default ("auto", "" and DEFAULT_TUNING_DIR), as from
  the environment. A bool setting takes a bool (or 0 or 1).

  Raises:
    ValueError: on assignment of a value of the wrong kind or out of range.
    AttributeError: on assignment (or reading, or deletion) of an attribute
      that is no setting; the message names the settings and the closest
      match.
  """
  disabled: bool = False
  timeout_ms: int = 30_000
  max_bytes: int = DEFAULT_MAX_BYTES
  algorithm: str = "auto"
  tuning_file: str = ""
  tuning_dir: str = DEFAULT_TUNING_DIR
  signatures: bool = True

  def __setattr__(self, name, value):
    super().__setattr__(name, _checked(name, value))
    # Every change is part of jit's cache keys: programs lowered before it
    # are lowered again on their next call.
    _generation.set_global(_generation.get_global() + 1)

  def __getattr__(self, name):
    # Only for attributes that are not found: no setting has that name.
    if name.startswith("__"):
      raise AttributeError(name)
    raise _unknown(name)

  def __delattr__(self, name):
    if name not in _VARIABLES:
      raise _unknown(name)
    raise AttributeError(f"jax_llar setting {name!r} cannot be deleted: assign it a value")

  def forced(self) -> Algorithm | None:
    """The algorithm `algorithm` names, or None for "auto"."""
    if self.algorithm == "auto":
      return None
    return Algorithm.from_short_name(self.algorithm)


# Bumped by every assignment to a setting; a JAX user context, so part of
# jit's tracing, lowering and compilation cache keys.
_generation = jax.make_user_context(default_value=0)


def _from_env() -> Settings:
  """The settings the JAX_LLAR_* variables give (the defaults for those
  unset or whitespace only).

  Raises:
    ValueError: a value the checks refuse; the message starts with
      `ENV_PREFIX` and names the variable.
  """
  s = Settings()
  for name, var in _VARIABLES.items():
    found = _env_value(var)
    if found is None:
      continue
    raw, text = found
    try:
      if name in _BOOLEAN:
        value: Any = _parse_bool(raw, text)
      elif name in _NUMERIC:
        value = _parse_int(name, raw, text)
      else:
        value = text
      setattr(s, name, value)
    except ValueError as e:
      raise ValueError(f"{ENV_PREFIX}{var}: {e}") from None
  return s


# The process's settings (a `Settings`), read from the JAX_LLAR_* environment
# variables at import; assign an attribute to change one (validated). Lowerings
# read them, so jitted functions are lowered again after a change.
settings = _from_env()
