"""The plan of a tune run: numbers of ranks, sizes, chain lengths, and the
command line a table built from saved results records. Without flags, so
that tests and other tools can import it (python -m jax_llar.tools.tune is
the command)."""

from __future__ import annotations

from jax_llar.tools.tune import tables as tune_tables
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
  if margin != tune_tables.DEFAULT_MARGIN:
    cmd += f" --margin={margin}"
  if allow_unsigned:
    cmd += " --allow_unsigned"
  if store_atomicity:
    cmd += f" --store_atomicity={','.join(store_atomicity)}"
  return cmd


def fastest(rows) -> dict[tuple[int, int, str], dict]:
  """Per (world_size, bytes_per_rank, dtype): the row of the fastest jax_llar
  algorithm that ran its own fast path with a correct output (``impl`` not
  lax.psum, ``correct`` and ``fast_path`` true), or no entry where none did.
  Rows are the JAX level's (jax_llar.tools.bench.jax_level.measure)."""
  best: dict[tuple[int, int, str], dict] = {}
  for r in rows:
    if r["impl"] == "lax.psum" or not r.get("correct") or r.get("fast_path") is not True:
      continue
    key = (r["world_size"], r["bytes_per_rank"], r["dtype"])
    if key not in best or r["us_per_call"] < best[key]["us_per_call"]:
      best[key] = r
  return best


# Impl name of the automatic choice in a verification run (jax_level.op maps
# every unforced "llar.*" name to jax_llar.psum).
AUTO = "llar.auto"


def verdicts(rows, slack: float = 0.05, speedup: float = 3.0,
             speedup_bytes: int = 1 << 20) -> list[dict]:
  """Issue 11's JAX-level criteria per (world_size, bytes_per_rank, dtype)
  of a verification run's rows (lax.psum, `AUTO` and the forced fastest
  algorithm of the tuning pass, measured together).

  Each verdict: world_size, bytes_per_rank, dtype, psum_us, auto_us,
  auto_algorithm (what the automatic choice ran; None: lax.psum), best_impl,
  best_us, auto_over_best (auto_us / best_us), psum_over_auto, and the
  booleans not_slower_than_psum (auto_us <= psum_us), near_best
  (auto_us <= (1 + slack) * min(best_us, psum_us): the best single choice,
  lax.psum included) and fast_enough (psum_over_auto >= speedup, asked only
  up to `speedup_bytes`; None above) and correct (every row's output
  matched its reference)."""
  units: dict[tuple[int, int, str], dict[str, dict]] = {}
  for r in rows:
    units.setdefault((r["world_size"], r["bytes_per_rank"], r["dtype"]), {})[r["impl"]] = r
  out = []
  for (world, nbytes, dtype), by in sorted(units.items()):
    psum, auto = by.get("lax.psum"), by.get(AUTO)
    if psum is None or auto is None:
      continue
    best = [r for i, r in by.items() if i not in ("lax.psum", AUTO)]
    best_row = min(best, key=lambda r: r["us_per_call"]) if best else None
    best_us = best_row["us_per_call"] if best_row else None
    floor = min(x for x in (best_us, psum["us_per_call"]) if x is not None)
    a, p = auto["us_per_call"], psum["us_per_call"]
    out.append({
        "world_size": world, "bytes_per_rank": nbytes, "dtype": dtype,
        "psum_us": p, "auto_us": a,
        "auto_algorithm": auto.get("algorithm") if auto.get("fast_path") else None,
        "best_impl": best_row["impl"] if best_row else None, "best_us": best_us,
        "auto_over_best": a / best_us if best_us else None,
        "psum_over_auto": p / a if a > 0 else None,
        "not_slower_than_psum": a <= p,
        "near_best": a <= (1 + slack) * floor,
        "fast_enough": (p / a >= speedup if a > 0 else False) if nbytes <= speedup_bytes
                       else None,
        "correct": all(r.get("correct") for r in by.values()),
    })
  return out
