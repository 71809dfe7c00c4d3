"""The ranges of the C++ parameters that jax_llar's numeric settings reach.

nanobind refuses a Python int outside its parameter's C++ type with a
TypeError ("incompatible function arguments"), and a larger type could
still overflow where the value is scaled (milliseconds to nanoseconds), so
``jax_llar.config`` accepts no value outside `native_range` (and checks, at
import, that what it accepts lies within it). tests/test_settings_bounds.py
checks `NATIVE_PARAMETERS` against the C++ declarations.
"""

from __future__ import annotations

import dataclasses

# The C++ integer types of the parameters below: type -> (least, largest value).
CPP_INTEGER_RANGES: dict[str, tuple[int, int]] = {
    "int": (-2**31, 2**31 - 1),  # 32 bits on every platform jax_llar builds for
    "uint32_t": (0, 2**32 - 1),
    "int64_t": (-2**63, 2**63 - 1),
    "uint64_t": (0, 2**64 - 1),
}


@dataclasses.dataclass(frozen=True)
class NativeParameter:
  """A C++ parameter (or field) that a numeric setting's value reaches.

  Attributes:
    setting: the setting (a field of `Settings`).
    source: the file that declares the parameter (relative to the
      repository), or the library that does.
    function: the function (a binding of ``jax_llar._llar`` in
      ``ffi/src/module.cc``, or a struct) that takes it.
    parameter: the parameter's name there.
    ctype: its C++ type, a key of `CPP_INTEGER_RANGES`.
    scale: what the parameter receives per unit of the setting (the
      setting's value times `scale`; ``timeout_ms`` reaches ``timeout_ns``
      times 1_000_000).
  """
  setting: str
  source: str
  function: str
  parameter: str
  ctype: str
  scale: int = 1

  def setting_range(self) -> tuple[int, int]:
    """The values of the setting whose `scale` multiple the parameter's type
    holds: (least, largest)."""
    lo, hi = CPP_INTEGER_RANGES[self.ctype]
    return -(-lo // self.scale), hi // self.scale


# Every native parameter a numeric setting reaches; `native_range` is the
# intersection of their ranges per setting, and the settings accept no value
# outside it (tests/test_settings_bounds.py checks the types against the C++).
NATIVE_PARAMETERS: tuple[NativeParameter, ...] = (
    # module.cc: create_comm_set(const std::vector<std::vector<int>>& groups,
    #   uint64_t timeout_ns) -> registry.h: CreateCommSet(..., uint64_t timeout_ns);
    # jax_llar.comm.get_or_create passes timeout_ms * 1_000_000.
    NativeParameter("timeout_ms", "ffi/src/module.cc", "create_comm_set", "timeout_ns",
                    "uint64_t", 1_000_000),
    # module.cc: create_comm_set_of_ranks(groups, uint64_t timeout_ns,
    #   uint64_t setup_timeout_ms) -> registry.h: CreateCommSetOfRanks; from
    # jax_llar.distributed.create: timeout_ms * 1_000_000, and
    # bootstrap_timeout_ms() = max(60_000, 2 * timeout_ms).
    NativeParameter("timeout_ms", "ffi/src/module.cc", "create_comm_set_of_ranks",
                    "timeout_ns", "uint64_t", 1_000_000),
    NativeParameter("timeout_ms", "ffi/src/module.cc", "create_comm_set_of_ranks",
                    "setup_timeout_ms", "uint64_t", 2),
    # jaxlib: DistributedRuntimeClient.blocking_key_value_get(key,
    #   int64_t timeout_in_ms), with bootstrap_timeout_ms() (jax_llar.distributed).
    NativeParameter("timeout_ms", "jaxlib", "blocking_key_value_get", "timeout_in_ms",
                    "int64_t", 2),
    # args.h: AllReduceArgs::n_bytes (uint32_t), the payload per rank
    # (handlers.cc casts it after checking it against the algorithm's
    # AlgorithmEntry::max_bytes, a std::size_t); max_bytes bounds that payload.
    NativeParameter("max_bytes", "ffi/include/llar/args.h", "AllReduceArgs", "n_bytes",
                    "uint32_t", 1),
)


def native_range(setting: str) -> tuple[int, int]:
  """(least, largest) value of the numeric `setting` that every native
  parameter it reaches (`NATIVE_PARAMETERS`) holds.

  Raises:
    KeyError: no native parameter is listed for `setting`.
  """
  ranges = [p.setting_range() for p in NATIVE_PARAMETERS if p.setting == setting]
  if not ranges:
    raise KeyError(setting)
  return max(lo for lo, _ in ranges), min(hi for _, hi in ranges)
