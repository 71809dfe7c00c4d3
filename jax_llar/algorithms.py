"""The all-reduce algorithms of jax_llar and their limits.

Each algorithm is one CUDA kernel of the extension (``ffi/src/kernels/``),
named by its decomposition; its integer id is the FFI attribute
``algorithm`` that the execute handler uses to pick the launcher. The ids and
limits here must equal the extension's (``ffi/include/llar/args.h``; the
module ``jax_llar._llar`` exports them as ``ALGORITHMS``, ``MAX_BYTES`` and
``MAX_RANKS``): ``tests/test_layout.py`` compares them with the C++ source and
``jax_llar._ext`` refuses to use an extension whose values differ.

Algorithms:
  ONE_SHOT_LL (1): every rank stores its payload, packed in 16-byte LL lines
    ``{d0, epoch, d1, epoch}``, into every rank's symmetric scratch, then
    polls its own scratch for the peers' lines and reduces the ranks in rank
    order; no barrier at entry or exit (arXiv 2607.16100, section 4.1; the LL
    protocol of NCCL). Payload per rank: up to 64 blocks x 512 lines x 8 bytes.
"""

from __future__ import annotations

import enum

import ml_dtypes
import numpy as np


class Algorithm(enum.IntEnum):
  """An all-reduce kernel of the extension; the value is its FFI id.

  ``int(algorithm)`` is the ``algorithm`` attribute of the custom call
  ``jax_llar_all_reduce``.

  Example::

    >>> Algorithm.ONE_SHOT_LL.short_name, Algorithm.ONE_SHOT_LL.impl
    ('one_shot_ll', 'llar.one_shot_ll')
  """
  ONE_SHOT_LL = 1

  @property
  def short_name(self) -> str:
    """The lower-case name: the extension's key and the tools' spelling."""
    return self.name.lower()

  @property
  def impl(self) -> str:
    """The implementation label used in logs and results, ``llar.<name>``."""
    return f"llar.{self.short_name}"

  @classmethod
  def from_short_name(cls, short_name: str) -> Algorithm:
    """The algorithm whose `short_name` is `short_name`.

    Raises:
      ValueError: no algorithm has that name (the message lists them).
    """
    for a in cls:
      if a.short_name == short_name:
        return a
    raise ValueError(f"unknown algorithm {short_name!r}; known: "
                     f"{', '.join(a.short_name for a in cls)}")

  def __repr__(self) -> str:
    return f"Algorithm.{self.name}"


# Largest number of ranks of one replica group that the kernels serve
# (args.h: kMaxRanks; the kernel argument block and the device communicator
# hold this many peer addresses).
MAX_RANKS = 16

# Largest payload per rank, in bytes, that each algorithm's scratch holds
# (args.h: kOneShotMaxBytes = kMaxBlocks * kLinesPerBlock * kPayloadBytesPerLine).
MAX_BYTES: dict[Algorithm, int] = {
    Algorithm.ONE_SHOT_LL: 64 * 512 * 8,
}

# The largest of MAX_BYTES: the cap of the JAX_LLAR_MAX_BYTES setting.
LARGEST_MAX_BYTES = max(MAX_BYTES.values())

# Element types the kernels reduce (reduce.cuh: one packing and accumulation
# rule per dtype). Every algorithm serves all of them.
SUPPORTED_DTYPES: tuple[np.dtype, ...] = (
    np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16),
    np.dtype(np.int32))
