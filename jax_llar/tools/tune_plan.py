"""The plan of a tune run: numbers of ranks, sizes, chain lengths, and the
command line a table built from saved results records. Without flags, so
that tests and other tools can import it (python -m jax_llar.tools.tune is
the command)."""

from __future__ import annotations

from jax_llar import tuning
from jax_llar.algorithms import MAX_RANKS


def default_ranks(n_gpus: int) -> list[int]:
  """2, 4, 8, 16 up to `n_gpus` (at most MAX_RANKS), and `n_gpus` itself."""
  n = min(n_gpus, MAX_RANKS)
  out = {r for r in (2, 4, 8, 16) if r <= n}
  if n >= 2:
    out.add(n)
  return sorted(out)


def default_sizes(min_bytes: int, max_bytes: int) -> list[int]:
  """Powers of two from the smallest >= `min_bytes` to `max_bytes`."""
  sizes, s = [], 1
  while s < min_bytes:
    s *= 2
  while s <= max_bytes:
    sizes.append(s)
    s *= 2
  return sizes


def chain_lengths(nbytes: int, k_short: int, k_long: int,
                  long_chain_bytes: int) -> tuple[int, int]:
  """(k_short, k_long) for a payload of `nbytes` per rank: as given up to
  `long_chain_bytes`, above it divided by nbytes / long_chain_bytes, at least
  2 and 16 steps (and k_long > k_short)."""
  if nbytes <= long_chain_bytes:
    return k_short, k_long
  f = nbytes / long_chain_bytes
  ks = max(2, min(k_short, int(k_short / f)))
  kl = max(16, min(k_long, int(k_long / f)))
  return ks, max(kl, ks + 1)


def from_results_command(paths, architecture: str | None, margin: float,
                         allow_unsigned: bool = False, store_atomicity=()) -> str:
  """The command line a table built from saved results records: the same
  files and options give the same table, wherever it is written."""
  cmd = f"python -m jax_llar.tools.tune --from_results={','.join(paths)}"
  if architecture:
    cmd += f" --architecture={architecture}"
  if margin != tuning.DEFAULT_MARGIN:
    cmd += f" --margin={margin}"
  if allow_unsigned:
    cmd += " --allow_unsigned"
  if store_atomicity:
    cmd += f" --store_atomicity={','.join(store_atomicity)}"
  return cmd
