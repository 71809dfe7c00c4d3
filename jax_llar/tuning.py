"""Tuning tables: the measured dispatch per GPU architecture and number of ranks.

A tuning table says, for psums over `ranks` ranks on GPUs of one
architecture ("sm_90" for compute capability 9.0), which implementation
serves each payload size per rank: ordered rows ``{max_bytes, algorithm}``,
where algorithm is an ``Algorithm`` short name or ``"lax.psum"``; a payload
of n bytes per rank goes to the first row with n <= max_bytes, and above the
last row to lax.psum (``jax_llar.policy.TuningTable`` holds the rules). Where
no table exists, the default rule decides (``policy.DEFAULT_ALGORITHM``, the
one-shot LL, up to its MAX_BYTES). Which table serves a psum (the tuning
file, this machine's tuning directory, the shipped tables) is
``jax_llar.table_lookup``'s; this module is the tables' format.

File format (JSON, one table per file, `file_name`)::

  {"format": "jax_llar.tuning/1", "architecture": "sm_90", "ranks": 2,
   "rows": [{"max_bytes": 262144, "algorithm": "one_shot_ll"}],
   "provenance": {"command": ..., "results_files": [...], ...}}

``provenance`` says how the table was made; its keys `PROVENANCE_KEYS` are
required (a value may be null where the measurement did not record it):
the command that made the table, the result files it was built from and
their SHA-256, the commit, date, GPU name and count, jax and NCCL versions of
the measurement, where the architecture came from, the rule that chose
(``jax_llar.tools.tune.tables.RULE``), what was measured (sizes, dtypes,
implementations) and a note on what the table cannot know (sizes and
algorithms not measured). It may also hold ``evidence``: the per-step times
behind each size's choice. A file that breaks the format raises
`TuningTableError`, naming the file.

Tables are built from measurements by ``python -m jax_llar.tools.tune``
(``jax_llar.tools.tune.tables``).
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any, Mapping

from jax_llar import jsonfile, policy
from jax_llar.algorithms import Algorithm

# The format tag of a tuning table file (its "format" key); `load` refuses
# any other.
FORMAT = "jax_llar.tuning/1"

# The tables shipped with jax_llar (package data: pyproject.toml's
# wheel.packages copies every file of the package that git does not ignore).
SHIPPED_DIR = pathlib.Path(__file__).resolve().parent / "tuning"

# The keys of a table's "provenance" (tune writes every one; `load` requires
# them).
PROVENANCE_KEYS = ("command", "results_files", "results_sha256", "commit", "date",
                   "gpu", "gpu_count", "jax", "nccl", "architecture_from", "rule",
                   "measured", "note")


class TuningTableError(ValueError):
  """A tuning table file that cannot be used; the message names the file."""


def file_name(architecture: str, ranks: int) -> str:
  """``"sm_90-2ranks.json"``: the name of the table for the pair in the
  tuning directory and among the shipped tables."""
  return f"{architecture}-{ranks}ranks.json"


def architecture_name(compute_capability) -> str | None:
  """``"sm_90"`` for the compute capability ``"9.0"`` (``"10.0"``:
  ``"sm_100"``); None for anything else (None, ``""``, ``"9"``)."""
  parts = str(compute_capability or "").strip().split(".")
  if len(parts) != 2 or not all(p.isdigit() for p in parts):
    return None
  name = f"sm_{int(parts[0])}{int(parts[1])}"
  return name if policy.ARCHITECTURE_PATTERN.fullmatch(name) else None


def architecture_of(device) -> str | None:
  """The architecture of a ``jax.Device``: from its ``compute_capability``
  (CUDA devices have it, e.g. ``"9.0"``), or None (not a CUDA GPU, or no
  such attribute)."""
  if getattr(device, "platform", None) != "gpu":
    return None
  return architecture_name(getattr(device, "compute_capability", None))


# --- reading and writing ------------------------------------------------------


def table_error(source, problem: str, hint: str = "") -> TuningTableError:
  """The error for table file `source`: ``jax_llar tuning table <source>:
  <problem> (<hint>)``."""
  return TuningTableError(f"jax_llar tuning table {source}: {problem}"
                          + (f" ({hint})" if hint else ""))


def from_dict(data: Any, source: str = "") -> policy.TuningTable:
  """The table a file's JSON content describes.

  Args:
    data: the parsed JSON (see the module docstring).
    source: the file's path, for messages and ``TuningTable.source``.

  Returns:
    a validated ``policy.TuningTable`` whose ``provenance`` is the file's.

  Raises:
    TuningTableError: wrong format tag, missing or unknown keys, an unknown
      algorithm, rows not sorted or above an algorithm's MAX_BYTES, ranks
      outside 2..MAX_RANKS, a bad architecture name, missing provenance keys.

  Example::

    >>> t = from_dict({"format": FORMAT, "architecture": "sm_90", "ranks": 2,
    ...                "rows": [{"max_bytes": 1024, "algorithm": "one_shot_ll"}],
    ...                "provenance": {k: None for k in PROVENANCE_KEYS}}, "t.json")
    >>> t.label, t.row_for(1024)[1].name, t.row_for(1025)
    ('sm_90 x 2 ranks', 'one_shot_ll', None)
  """
  if not isinstance(data, dict):
    raise table_error(source, "not a JSON object")
  if data.get("format") != FORMAT:
    raise table_error(source, f"format must be {FORMAT!r}, got {data.get('format')!r}")
  keys = {"format", "architecture", "ranks", "rows", "provenance"}
  if set(data) != keys:
    missing, extra = sorted(keys - set(data)), sorted(set(data) - keys)
    raise table_error(source, "keys must be " + ", ".join(sorted(keys))
                + (f"; missing {', '.join(missing)}" if missing else "")
                + (f"; unknown {', '.join(extra)}" if extra else ""))
  prov = data["provenance"]
  if not isinstance(prov, dict):
    raise table_error(source, "provenance must be a JSON object")
  missing = [k for k in PROVENANCE_KEYS if k not in prov]
  if missing:
    raise table_error(source, f"provenance lacks {', '.join(missing)}",
                "tables record how they were measured: write them with python -m "
                "jax_llar.tools.tune, or --from_results from saved results files")
  if not isinstance(data["rows"], list):
    raise table_error(source, "rows must be a list")
  rows = []
  for i, r in enumerate(data["rows"]):
    if not isinstance(r, dict) or set(r) != {"max_bytes", "algorithm"}:
      raise table_error(source, f"row {i + 1} must be an object with exactly max_bytes "
                  f"and algorithm, got {r!r}")
    name = r["algorithm"]
    if name == policy.LAX_PSUM:
      algorithm = None
    else:
      try:
        algorithm = Algorithm.from_short_name(name)
      except ValueError as e:
        raise table_error(source, f"row {i + 1}: {e} or {policy.LAX_PSUM}") from None
    rows.append(policy.TableRow(r["max_bytes"], algorithm))
  try:
    return policy.TuningTable(data["architecture"], data["ranks"], tuple(rows),
                              source=str(source), provenance=prov)
  except ValueError as e:
    raise table_error(source, str(e)) from None


def to_dict(table: policy.TuningTable) -> dict[str, Any]:
  """The JSON content of `table` (inverse of `from_dict`)."""
  return {"format": FORMAT, "architecture": table.architecture, "ranks": table.ranks,
          "rows": [{"max_bytes": r.max_bytes, "algorithm": r.name} for r in table.rows],
          "provenance": dict(table.provenance)}


def dumps(data: Mapping[str, Any]) -> str:
  """The text of a table file: JSON, two-space indent, a final newline."""
  return json.dumps(data, indent=2) + "\n"


def load(path, *, hint: str = "") -> policy.TuningTable:
  """Reads and validates the table file at `path`.

  Reads the file every time (no cache; `lookup` caches what it reads) and
  whatever its name: the name's architecture and ranks are not checked
  against the content here (`lookup` does that for the files it finds).

  Args:
    path: the file, a str or ``os.PathLike`` (UTF-8 JSON in the format of
      the module docstring).
    hint: what to do about a bad file (e.g. which setting names it),
      appended to an error's message in parentheses; "" adds nothing.

  Returns:
    the validated ``policy.TuningTable``: its rows in increasing
    ``max_bytes`` (bytes per rank), ``source`` the path as a str
    (``os.fspath(path)``), ``provenance`` the file's.

  Raises:
    TuningTableError: the file cannot be read (missing, a directory or
      another file that is not regular, such as a FIFO, which is never
      opened; no permission), is not UTF-8 JSON, nests arrays and objects
      deeper than ``jsonfile.MAX_JSON_DEPTH``, or breaks the format (`from_dict`); the
      message starts ``"jax_llar tuning table <path>: "`` and says which.

  Example::

    >>> t = load(SHIPPED_DIR / "sm_90-2ranks.json")
    >>> t.label, [(r.max_bytes, r.name) for r in t.rows]
    ('sm_90 x 2 ranks', [(262144, 'one_shot_ll')])
  """
  path = os.fspath(path)
  try:
    data, _ = jsonfile.read(path)
  except jsonfile.Unreadable as e:
    raise table_error(path, str(e), hint) from None
  try:
    return from_dict(data, path)
  except TuningTableError as e:
    raise TuningTableError(str(e) + (f" ({hint})" if hint else "")) from None


def write(data: Mapping[str, Any], directory) -> str:
  """Validates the table `data` and writes it to
  ``<directory>/<architecture>-<ranks>ranks.json`` (`file_name`).

  The text is ``dumps(data)``, `data` as given (not normalised through
  ``policy.TuningTable``). It goes to ``<path>.tmp<pid>`` first, then
  replaces a file of that name at once (``os.replace``), so a reader never
  sees it half-written. Nothing is written when validation fails. Written
  to the tuning directory (``settings.tuning_dir``), the table serves its
  pair from the next lowering that looks the pair up (`lookup` reads a file
  again after it changes); programs lowered before keep their decisions.

  Args:
    data: the table's JSON content, as `to_dict` or `build_tables` give it
      (keys format, architecture, ranks, rows, provenance).
    directory: where to write, a str or ``os.PathLike``; created, with its
      parents, when missing.

  Returns:
    the path of the written file, ``os.path.join(directory, file_name(...))``.

  Raises:
    TuningTableError: `data` breaks the format (`from_dict`; the message
      names the source "(to be written)").
    OSError: the directory cannot be created or written.
    TypeError: provenance holds a value JSON cannot encode; the target is
      left as it was, but the empty temporary file stays behind.

  Example::

    >>> write({"format": FORMAT, "architecture": "sm_90", "ranks": 4,
    ...        "rows": [{"max_bytes": 1024, "algorithm": "one_shot_ll"}],
    ...        "provenance": {k: None for k in PROVENANCE_KEYS}},
    ...       "/tmp/tuning")  # doctest: +SKIP
    '/tmp/tuning/sm_90-4ranks.json'
  """
  table = from_dict(data, "(to be written)")
  os.makedirs(directory, exist_ok=True)
  path = os.path.join(directory, file_name(table.architecture, table.ranks))
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "w", encoding="utf-8") as f:
    f.write(dumps(data))
  os.replace(tmp, path)
  return path
