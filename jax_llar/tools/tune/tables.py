"""Building tuning tables from measurements (``python -m jax_llar.tools.tune``
and its ``--from_results`` mode).

From JAX-level result files (rows of ``jax_llar.tools.bench.jax_level``: per
implementation, dtype and size, the per-step time of a jitted chain and
whether its output was bitwise correct), per number of ranks, per size, the
rule `RULE` picks an implementation; neighbouring sizes with the same pick
merge into one row. Rows of the non-deterministic algorithms
(``jax_llar.algorithms.NON_DETERMINISTIC``: floating-point atomics) are left
out before anything else (their output is not bitwise any reference, and a
table never chooses them); the table's provenance note names them. The
tables' format, their reading and the lookup are ``jax_llar.tuning``'s.
"""

from __future__ import annotations

import hashlib
import math
import os
from typing import Any, Iterable, Mapping, Sequence

from jax_llar import _ext, jsonfile, policy
from jax_llar.algorithms import (MAX_BYTES, MAX_RANKS, NEEDS_STORE_ATOMICITY, NON_DETERMINISTIC,
                                 SIGNED, Algorithm)
from jax_llar.tuning import FORMAT, TuningTableError, architecture_name, from_dict

# Default margin of the rule: a jax_llar algorithm replaces lax.psum at a size
# only when it is at least this much faster there, for every dtype measured.
DEFAULT_MARGIN = 0.05

# The builder's rule in words (build_tables), recorded in every table's
# provenance.
RULE = ("per size: the jax_llar algorithms whose rows are bitwise correct and "
        "ran on their fast path for every dtype measured at that size compete; "
        "each scores its largest ratio of per-step time to lax.psum's over the "
        "dtypes, and the lowest score (then the lowest algorithm id) is the "
        "best; the best replaces lax.psum only when its score is at most "
        "1 - margin (margin {margin}), else lax.psum serves the size (noise "
        "and ties go to lax.psum). Neighbouring sizes with the same choice "
        "merge into one row whose max_bytes is the largest such size; a "
        "payload between two measured sizes takes the larger size's choice, "
        "payloads below the smallest measured size the first row's, payloads "
        "above the largest lax.psum.")


class TuningBuildError(ValueError):
  """Result files from which no table can be built; the message says why."""


def _read_results(path: str) -> tuple[dict[str, Any], str]:
  """(the JSON object, its SHA-256) of the result file `path`.

  Raises:
    TuningBuildError: ``jsonfile.read``'s problems, or not a JSON object.
  """
  try:
    data, raw = jsonfile.read(os.fspath(path))
  except jsonfile.Unreadable as e:
    raise TuningBuildError(f"{path}: {e}") from None
  if not isinstance(data, dict):
    raise TuningBuildError(f"{path}: is not a result file: a JSON object, got "
                           f"{jsonfile.kind(data)}")
  return data, hashlib.sha256(raw).hexdigest()


def read_results(path) -> dict[str, Any]:
  """The JSON object of a result file (a JAX-level or tune result, a
  store-atomicity record), read as the table files are: a FIFO or a device
  is never opened, and nesting beyond ``jsonfile.MAX_JSON_DEPTH`` is refused before
  parsing.

  Raises:
    TuningBuildError: the file is missing, a directory or another file that
      is not regular, unreadable, not UTF-8 JSON, nested too deeply, or not
      a JSON object; the message starts with the path.
  """
  return _read_results(path)[0]


def _member(result: Mapping[str, Any], key: str, kind: type, path: str,
            where: str = "") -> Any:
  """`result[key]`: an empty `kind` when absent or null, else it must be a
  `kind` (a JSON object or array)."""
  value = result.get(key)
  if value is None:
    return kind()
  if not isinstance(value, kind):
    name = "a JSON object" if kind is dict else "a JSON array"
    raise TuningBuildError(f"{path}: {where}{key} must be {name}, got {jsonfile.kind(value)}")
  return value


def _checked_results(result: dict[str, Any], path: str) -> dict[str, Any]:
  """`result` once the members build_tables reads have their JSON types:
  ``env`` an object (its ``devices`` and ``compute_capabilities`` arrays),
  ``rows`` an array of objects, ``architecture`` a string."""
  env = _member(result, "env", dict, path)
  for key in ("devices", "compute_capabilities"):
    _member(env, key, list, path, "env.")
  rows = _member(result, "rows", list, path)
  for i, row in enumerate(rows):
    if not isinstance(row, dict):
      raise TuningBuildError(f"{path}: row {i + 1} must be a JSON object, got "
                             f"{jsonfile.kind(row)}")
  arch = result.get("architecture")
  if arch and not isinstance(arch, str):
    raise TuningBuildError(f"{path}: architecture must be a string, got {jsonfile.kind(arch)}")
  return result


def _positive_int(value: Any) -> bool:
  return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _nccl(code) -> str | None:
  if not isinstance(code, int) or isinstance(code, bool) or code <= 0:
    return None
  return _ext.nccl_version_string(code)


def _joined(values: Iterable) -> Any:
  """One value when all agree, else the distinct values joined by ", "."""
  vals = []
  for v in values:
    if v not in vals:
      vals.append(v)
  if len(vals) == 1:
    return vals[0]
  return ", ".join(str(v) for v in vals)


def _architecture_of_results(result: Mapping[str, Any]) -> str | None:
  """The architecture a result file records (``architecture``, or the
  environment's ``compute_capabilities``), or None."""
  if result.get("architecture"):
    return str(result["architecture"])
  caps = (result.get("env") or {}).get("compute_capabilities") or []
  archs = {architecture_name(c) for c in caps}
  if len(archs) == 1 and None not in archs:
    return archs.pop()
  return None


def _implementation(row: Mapping[str, Any]) -> str | None:
  """``"lax.psum"``, an algorithm's short name, or None (a row the table
  does not use: the copy calls, diagnostics, lax.psum under XLA flags).

  A jax_llar row names the algorithm that ran in ``algorithm`` (None: it
  fell back, and is not used); a row without that key is the algorithm its
  impl ``llar.<name>`` names, true of files written before the JAX level
  recorded it (jax_llar then had that one algorithm on its fast path)."""
  impl = row.get("impl")
  if impl == policy.LAX_PSUM:
    return policy.LAX_PSUM
  if not isinstance(impl, str) or not impl.startswith("llar."):
    return None
  name = row["algorithm"] if "algorithm" in row else impl[len("llar."):]
  if name is None:
    return None
  try:
    return Algorithm.from_short_name(name).short_name
  except ValueError:
    raise TuningBuildError(f"row {impl} names no algorithm jax_llar has "
                           f"({name!r})") from None


def _choose(times: Mapping[str, Mapping[str, float]], fast: Mapping[str, bool],
            margin: float) -> tuple[str, dict[str, float]]:
  """(choice, score per algorithm) at one size by `RULE`. `times`: impl ->
  dtype -> us per step; `fast`: algorithm -> ran on its fast path at every
  dtype."""
  psum = times[policy.LAX_PSUM]
  scores = {}
  for name, by_dtype in times.items():
    if name == policy.LAX_PSUM or not fast.get(name):
      continue
    if set(by_dtype) != set(psum):
      continue  # not measured at every dtype lax.psum was
    scores[name] = max(by_dtype[d] / psum[d] for d in psum)
  if not scores:
    return policy.LAX_PSUM, scores
  best = min(scores, key=lambda n: (scores[n], int(Algorithm.from_short_name(n))))
  return (best if scores[best] <= 1 - margin else policy.LAX_PSUM), scores


def store_atomicity_validation(paths: Sequence[str]) -> str | None:
  """Why the store-atomicity records at `paths` do not validate the LL128
  algorithms (``algorithms.NEEDS_STORE_ATOMICITY``), or None when they do.

  They validate when at least one record ran across two devices
  (``over_nvlink``), in each direction between the devices it names, and
  every record passed: complete, no torn line, no bad word.

  Raises:
    TuningBuildError: a file cannot be read, is not JSON or not a JSON
      object (`read_results`).
  """
  if not paths:
    return "no store-atomicity record given"
  directions = set()
  for p in paths:
    r = read_results(p)
    if r.get("level") != "store_atomicity":
      return f"{p} is not a store-atomicity record (level {r.get('level')!r})"
    if not (r.get("passed") is True and r.get("complete") is True
            and r.get("torn_lines") == 0 and r.get("bad_words") == 0):
      return f"{p} did not pass (verdict {r.get('verdict')!r})"
    if r.get("over_nvlink") is True:
      st = r.get("settings")
      devices = (st.get("writer_device"), st.get("reader_device")) if isinstance(
          st, dict) else (None, None)
      if not all(isinstance(d, int) and not isinstance(d, bool) for d in devices):
        return f"{p} does not name its writer and reader devices (settings)"
      directions.add(devices)
  if not directions:
    return "no record ran across two devices (over_nvlink)"
  missing = [(b, a) for a, b in directions if (b, a) not in directions]
  if missing:
    return f"no record in the direction writer {missing[0][0]} -> reader {missing[0][1]}"
  return None


def build_tables(paths: Sequence[str], *, command: str,
                 architecture: str | None = None,
                 margin: float = DEFAULT_MARGIN,
                 allow_unsigned: bool = False,
                 validated_by: Sequence[str] = ()) -> list[dict[str, Any]]:
  """Tuning tables, one per number of ranks, from JAX-level result files.

  Reads the rows of each file (``jax_llar.tools.bench --level jax`` or
  ``jax_llar.tools.tune``): per implementation (``lax.psum``,
  ``llar.<algorithm>``; other rows are ignored, and so are the rows of an
  algorithm of NON_DETERMINISTIC, which no table may choose, and, unless
  `allow_unsigned`, of an algorithm outside ``algorithms.SIGNED``, whose
  lines carry no call signature, so that a mispaired call of it can be
  summed with another call's data: ``jax_llar.signature``), world size,
  dtype and bytes per rank, the per-step time ``us_per_call`` and
  ``correct``. Chooses per size by `RULE` and merges neighbouring sizes into
  rows.

  Args:
    paths: the result files, as they are to be recorded (relative to the
      working directory, or absolute).
    command: the command line that builds the table, recorded.
    architecture: e.g. ``"sm_90"``, for files that do not record it (the
      JAX level's environment block recorded GPU names only before
      ``compute_capabilities`` was added); must agree with a file that does.
    margin: see `RULE`; 0 <= margin < 1.
    allow_unsigned: let the table choose the unsigned algorithms too
      (``python -m jax_llar.tools.tune --allow_unsigned``); the provenance
      note says which rows were left out otherwise.
    validated_by: store-atomicity records (``python -m
      jax_llar.tools.store_atomicity``); unless they validate the LL128
      algorithms (`store_atomicity_validation`), the rows of
      ``algorithms.NEEDS_STORE_ATOMICITY`` are left out, and the provenance
      note says why.

  Returns:
    one table per number of ranks, as the JSON content of a table file
    (``from_dict`` accepts each), in increasing ranks.

  Raises:
    TuningBuildError: a file cannot be read (`read_results`: missing, a
      directory or another file that is not regular, not UTF-8 JSON, nested
      too deeply, not a JSON object), or a member has the wrong JSON type
      (``env`` not an object, ``rows`` not an array of objects, a row's
      ``dtype`` not a string, ``bytes_per_rank`` not a positive integer,
      ``world_size`` not one in 2..MAX_RANKS, ``us_per_call`` not a
      number); no usable rows; a used row is not correct (a wrong result is
      never tuned around: the run must be repeated); a size without a
      lax.psum row or with a non-positive time; a row measured twice; the
      architecture unknown or contradicting; margin out of range. Nothing
      else: every message is one line that names the file or the row.
  """
  if not 0 <= margin < 1:
    raise TuningBuildError(f"margin must be in [0, 1), got {margin}")
  results, digests = [], []
  for p in paths:
    result, digest = _read_results(p)
    results.append(_checked_results(result, p))
    digests.append(digest)
  archs = {a for a in map(_architecture_of_results, results) if a is not None}
  if len(archs) > 1:
    raise TuningBuildError(f"the result files are from several architectures: "
                           f"{', '.join(sorted(archs))}")
  if archs and architecture is not None and architecture not in archs:
    raise TuningBuildError(f"--architecture {architecture} contradicts the result "
                           f"files' {archs.pop()}")
  if archs:
    arch, arch_from = archs.pop(), "the result files' compute capabilities"
  elif architecture is not None:
    arch = architecture
    gpus = _joined(d for r in results for d in (r.get("env") or {}).get("devices") or [])
    arch_from = (f"given on the command line (the result files record the GPU "
                 f"names only: {gpus})")
  else:
    raise TuningBuildError("the result files do not record the GPUs' compute "
                           "capability: give the architecture with --architecture "
                           "(e.g. --architecture=sm_90)")
  if not policy.ARCHITECTURE_PATTERN.fullmatch(arch):
    raise TuningBuildError(f"architecture must look like 'sm_90', got {arch!r}")

  # world -> bytes -> impl -> dtype -> (us, fast)
  data: dict[int, dict[int, dict[str, dict[str, tuple[float, bool]]]]] = {}
  bad = []
  left_out: set[str] = set()  # non-deterministic algorithms' rows
  unsigned: set[str] = set()  # rows of algorithms without call signatures
  unvalidated: set[str] = set()  # LL128 rows without a store-atomicity record
  atomicity = store_atomicity_validation(validated_by)
  for path, result in zip(paths, results):
    for row in result.get("rows") or []:
      try:
        name = _implementation(row)
      except TuningBuildError as e:
        raise TuningBuildError(f"{path}: {e}") from None
      if name is None:
        continue
      if name != policy.LAX_PSUM and Algorithm.from_short_name(name) in NON_DETERMINISTIC:
        left_out.add(name)
        continue
      if (name != policy.LAX_PSUM and not allow_unsigned
          and Algorithm.from_short_name(name) not in SIGNED):
        unsigned.add(name)
        continue
      if (name != policy.LAX_PSUM and atomicity is not None
          and Algorithm.from_short_name(name) in NEEDS_STORE_ATOMICITY):
        unvalidated.add(name)
        continue
      missing = [k for k in ("impl", "dtype", "bytes_per_rank", "world_size", "us_per_call")
                 if k not in row]
      if missing:
        raise TuningBuildError(f"{path}: a {name} row lacks {', '.join(missing)}")
      for key, ok, what in (
          ("dtype", isinstance(row["dtype"], str), "a string"),
          ("bytes_per_rank", _positive_int(row["bytes_per_rank"]), "a positive integer"),
          ("world_size", _positive_int(row["world_size"])
           and 2 <= row["world_size"] <= MAX_RANKS, f"an integer in 2..{MAX_RANKS}"),
          ("us_per_call", isinstance(row["us_per_call"], (int, float))
           and not isinstance(row["us_per_call"], bool), "a number")):
        if not ok:
          raise TuningBuildError(f"{path}: a {name} row's {key} must be {what}, got "
                                 f"{jsonfile.kind(row[key])} {jsonfile.short(row[key])}")
      where = (f"{path}: {row['impl']} {row['dtype']} {row['bytes_per_rank']} B "
               f"{row['world_size']} ranks")
      if row.get("correct") is not True:
        bad.append(where)
        continue
      us = float(row["us_per_call"])
      if not math.isfinite(us) or us <= 0:
        raise TuningBuildError(f"{where}: per-step time {us} us is not positive "
                               "(noise around a cost near zero: measure with longer chains)")
      fast = name == policy.LAX_PSUM or row.get("fast_path") is True
      cell = data.setdefault(int(row["world_size"]), {}).setdefault(
          int(row["bytes_per_rank"]), {}).setdefault(name, {})
      if row["dtype"] in cell:
        raise TuningBuildError(f"{where}: measured twice")
      cell[row["dtype"]] = (us, fast)
  if bad:
    raise TuningBuildError("rows whose output matched no reference (repeat the "
                           "run; no table is built around a wrong result): "
                           + "; ".join(bad[:10]))
  if not data:
    raise TuningBuildError("no lax.psum or jax_llar rows in " + ", ".join(paths))

  envs = [r.get("env") or {} for r in results]
  tables = []
  for world in sorted(data):
    sizes = sorted(data[world])
    choices, evidence = [], []
    for size in sizes:
      cell = data[world][size]
      if policy.LAX_PSUM not in cell:
        raise TuningBuildError(f"{size} B at {world} ranks has no lax.psum row: "
                               "every size needs lax.psum measured in the same run")
      times = {n: {d: v[0] for d, v in by.items()} for n, by in cell.items()}
      fast = {n: all(v[1] for v in by.values()) for n, by in cell.items()}
      choice, scores = _choose(times, fast, margin)
      if choice != policy.LAX_PSUM and size > MAX_BYTES[Algorithm.from_short_name(choice)]:
        raise TuningBuildError(f"{choice} measured on its fast path at {size} B, above "
                               "its MAX_BYTES")
      choices.append(choice)
      evidence.append({"bytes_per_rank": size, "choice": choice,
                       "us_per_step": times,
                       "score": {n: round(s, 4) for n, s in scores.items()},
                       "not_fast": sorted(n for n, f in fast.items() if not f)})
    rows: list[dict[str, Any]] = []
    for size, choice in zip(sizes, choices):
      if rows and rows[-1]["algorithm"] == choice:
        rows[-1]["max_bytes"] = size
      else:
        rows.append({"max_bytes": size, "algorithm": choice})
    while rows and rows[-1]["algorithm"] == policy.LAX_PSUM:
      rows.pop()
    measured_impls = sorted({n for s in sizes for n in data[world][s]},
                            key=lambda n: (n != policy.LAX_PSUM, n))
    dtypes = sorted({d for s in sizes for by in data[world][s].values() for d in by})
    note = (f"Chooses only among what was measured on {world} ranks: "
            f"{', '.join(measured_impls)}; any other algorithm was never measured "
            f"here, so this table never chooses it. Sizes {sizes[0]} to {sizes[-1]} "
            f"bytes per rank were measured ({len(sizes)} sizes): smaller payloads "
            f"take the first row's choice, larger ones lax.psum.")
    if left_out:
      note += (f" Rows of {', '.join(sorted(left_out))} were left out: not "
               "deterministic (floating-point atomics), never chosen by a table.")
    if unsigned:
      note += (f" Rows of {', '.join(sorted(unsigned))} were left out: their lines "
               "carry no call signature (a mispaired call would not be detected); "
               "--allow_unsigned lets a table choose them.")
    if unvalidated:
      note += (f" Rows of {', '.join(sorted(unvalidated))} were left out: LL128 lines "
               f"need 128-byte stores to arrive whole across devices, and {atomicity} "
               "(--store_atomicity gives passing cross-device records).")
    provenance = {
        "command": command,
        "results_files": list(paths),
        "results_sha256": digests,
        "commit": _joined(e.get("git_commit") for e in envs),
        "date": _joined(e.get("date") for e in envs),
        "gpu": _joined(d for e in envs for d in e.get("devices") or []),
        "gpu_count": _joined(e.get("device_count") for e in envs),
        "jax": _joined(e.get("jax") for e in envs),
        "nccl": _joined(_nccl(e.get("nccl_runtime")) for e in envs),
        "architecture_from": arch_from,
        "rule": RULE.format(margin=margin),
        "measured": {"sizes": sizes, "dtypes": dtypes, "implementations": measured_impls},
        "note": note,
        "evidence": evidence,
    }
    table = {"format": FORMAT, "architecture": arch, "ranks": world, "rows": rows,
             "provenance": provenance}
    try:
      from_dict(table, f"(built from {', '.join(paths)})")  # the rules hold
    except TuningTableError as e:
      raise TuningBuildError(str(e)) from None
    tables.append(table)
  return tables
