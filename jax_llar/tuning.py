"""Tuning tables: the measured dispatch per GPU architecture and number of ranks.

A tuning table says, for psums over `ranks` ranks on GPUs of one
architecture ("sm_90" for compute capability 9.0), which implementation
serves each payload size per rank: ordered rows ``{max_bytes, algorithm}``,
where algorithm is an ``Algorithm`` short name or ``"lax.psum"``; a payload
of n bytes per rank goes to the first row with n <= max_bytes, and above the
last row to lax.psum (``jax_llar.policy.TuningTable`` holds the rules). Where
no table exists, the default rule decides (``policy.DEFAULT_ALGORITHM``, the
one-shot LL, up to its MAX_BYTES).

For an (architecture, ranks) pair the table comes from, in this order:
  1. ``settings.tuning_file`` (``JAX_LLAR_TUNING_FILE``), when that file is
     for the pair (a file for another pair leaves the pair to 2-4);
  2. ``<settings.tuning_dir>/<architecture>-<ranks>ranks.json``
     (``JAX_LLAR_TUNING_DIR``, default ``~/.cache/jax_llar/tuning``): this
     machine's table, written by ``python -m jax_llar.tools.tune``;
  3. the table shipped with jax_llar, ``jax_llar/tuning/<same name>``;
  4. none: the default rule.
A file is read the first time a lowering needs its pair, and again after it
changes; a program lowered before keeps its decisions (jit's cache: assign a
setting, or restart, to lower again). A file that breaks the format raises
`TuningTableError`, naming the file, from the lowering that reads it.

File format (JSON, one table per file)::

  {"format": "jax_llar.tuning/1", "architecture": "sm_90", "ranks": 2,
   "rows": [{"max_bytes": 262144, "algorithm": "one_shot_ll"}],
   "provenance": {"command": ..., "results_files": [...], ...}}

``provenance`` says how the table was made; its keys `PROVENANCE_KEYS` are
required (a value may be null where the measurement did not record it):
the command that made the table, the result files it was built from and
their SHA-256, the commit, date, GPU name and count, jax and NCCL versions of
the measurement, where the architecture came from, the rule that chose
(`RULE`), what was measured (sizes, dtypes, implementations) and a note on
what the table cannot know (sizes and algorithms not measured). It may also
hold ``evidence``: the per-step times behind each size's choice.

Tables are built from measurements by ``python -m jax_llar.tools.tune``
(``jax_llar.tools.tune_tables``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import stat
import threading
from typing import Any, Iterable, Mapping

from jax_llar import jsonfile, policy
from jax_llar.algorithms import MAX_BYTES, Algorithm
from jax_llar.config import settings

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


def _fail(source, problem: str, hint: str = "") -> TuningTableError:
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
    raise _fail(source, "not a JSON object")
  if data.get("format") != FORMAT:
    raise _fail(source, f"format must be {FORMAT!r}, got {data.get('format')!r}")
  keys = {"format", "architecture", "ranks", "rows", "provenance"}
  if set(data) != keys:
    missing, extra = sorted(keys - set(data)), sorted(set(data) - keys)
    raise _fail(source, "keys must be " + ", ".join(sorted(keys))
                + (f"; missing {', '.join(missing)}" if missing else "")
                + (f"; unknown {', '.join(extra)}" if extra else ""))
  prov = data["provenance"]
  if not isinstance(prov, dict):
    raise _fail(source, "provenance must be a JSON object")
  missing = [k for k in PROVENANCE_KEYS if k not in prov]
  if missing:
    raise _fail(source, f"provenance lacks {', '.join(missing)}",
                "tables record how they were measured: write them with python -m "
                "jax_llar.tools.tune, or --from_results from saved results files")
  if not isinstance(data["rows"], list):
    raise _fail(source, "rows must be a list")
  rows = []
  for i, r in enumerate(data["rows"]):
    if not isinstance(r, dict) or set(r) != {"max_bytes", "algorithm"}:
      raise _fail(source, f"row {i + 1} must be an object with exactly max_bytes "
                  f"and algorithm, got {r!r}")
    name = r["algorithm"]
    if name == policy.LAX_PSUM:
      algorithm = None
    else:
      try:
        algorithm = Algorithm.from_short_name(name)
      except ValueError as e:
        raise _fail(source, f"row {i + 1}: {e} or {policy.LAX_PSUM}") from None
    rows.append(policy.TableRow(r["max_bytes"], algorithm))
  try:
    return policy.TuningTable(data["architecture"], data["ranks"], tuple(rows),
                              source=str(source), provenance=prov)
  except ValueError as e:
    raise _fail(source, str(e)) from None


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
    raise _fail(path, str(e), hint) from None
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


# --- which table serves a psum ------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Lookup:
  """Which table serves psums of one architecture and number of ranks.

  Attributes:
    architecture: e.g. ``"sm_90"``; None when unknown (devices that are not
      CUDA GPUs) or not one (devices of several architectures).
    ranks: ranks per replica group.
    table: the table, or None (the default rule).
    origin: ``"file"`` (settings.tuning_file), ``"user"`` (the tuning
      directory), ``"shipped"``, or ``"default"`` (no table).
    note: for the default rule, why there is no table (e.g. ``"no tuning
      table for sm_90 x 4 ranks"``); else the table's path.
    refusal: why no decision may be taken for the group (its devices differ
      in architecture), or None.
  """
  architecture: str | None
  ranks: int
  table: policy.TuningTable | None
  origin: str
  note: str
  refusal: str | None = None

  def to_dict(self) -> dict[str, Any]:
    """What ``jax_llar.status()`` reports for the pair."""
    d: dict[str, Any] = {"architecture": self.architecture, "ranks": self.ranks,
                         "origin": self.origin, "path": None, "rows": None,
                         "provenance": None}
    if self.table is None:
      d["note"] = self.note
      d["rule"] = (self.refusal or f"default rule: {policy.DEFAULT_ALGORITHM.short_name} "
                   f"up to {MAX_BYTES[policy.DEFAULT_ALGORITHM]} bytes per rank, "
                   "lax.psum above")
      return d
    p = self.table.provenance
    d["path"] = self.table.source
    d["rows"] = [{"max_bytes": r.max_bytes, "algorithm": r.name} for r in self.table.rows]
    d["provenance"] = {k: p.get(k) for k in ("command", "results_files", "commit", "date",
                                             "gpu", "gpu_count", "jax", "nccl", "note")}
    return d


_lock = threading.Lock()
_files: dict[str, tuple[tuple[int, int], policy.TuningTable]] = {}
_seen: dict[tuple[str | None, int], Lookup] = {}


def _read(path: str, hint: str = "") -> policy.TuningTable:
  """`load`, cached while the file's mtime and size stay the same."""
  problem = jsonfile.problem(path)
  if problem is not None:
    raise _fail(path, problem, hint)
  try:
    st = os.stat(path)
  except OSError as e:  # gone since
    raise _fail(path, f"cannot be read: {e.strerror or e}", hint) from None
  key = (st.st_mtime_ns, st.st_size)
  with _lock:
    hit = _files.get(path)
  if hit is not None and hit[0] == key:
    return hit[1]
  table = load(path, hint=hint)
  with _lock:
    _files[path] = (key, table)
  return table


def _lookup(architecture: str | None, ranks: int) -> Lookup:
  forced = settings.tuning_file
  if forced:
    path = os.path.abspath(os.path.expanduser(forced))
    hint = "JAX_LLAR_TUNING_FILE / settings.tuning_file names it"
    # Read for every pair, so that a broken file fails early; missing, a
    # directory, a FIFO...: the error says which.
    table = _read(path, hint)
    if (table.architecture, table.ranks) == (architecture, ranks):
      return Lookup(architecture, ranks, table, "file", path)
  if architecture is None:
    return Lookup(None, ranks, None, "default",
                  "architecture unknown (the devices are not CUDA GPUs)")
  name = file_name(architecture, ranks)
  for origin, directory, hint in (
      ("user", os.path.expanduser(settings.tuning_dir),
       "the tuning directory, JAX_LLAR_TUNING_DIR: fix, delete or re-run "
       "python -m jax_llar.tools.tune"),
      ("shipped", str(SHIPPED_DIR), "shipped with jax_llar: reinstall it")):
    path = os.path.abspath(os.path.join(directory, name))
    try:
      mode = os.stat(path).st_mode
    except (OSError, ValueError):  # none there (or the directory unreadable)
      continue
    if not stat.S_ISREG(mode):  # a directory or a FIFO of the table's name
      raise _fail(path, jsonfile.file_kind(mode), hint)
    table = _read(path, hint)
    if (table.architecture, table.ranks) != (architecture, ranks):
      raise _fail(path, f"holds the table for {table.label}, but its name is for "
                  f"{architecture} x {ranks} ranks", hint)
    return Lookup(architecture, ranks, table, origin, path)
  return Lookup(architecture, ranks, None, "default",
                f"no tuning table for {architecture} x {ranks} ranks")


def lookup(architecture: str | None, ranks: int) -> Lookup:
  """The table that serves psums over `ranks` ranks on GPUs of
  `architecture`, by the precedence of the module docstring.

  In order: ``settings.tuning_file`` when it holds this pair's table (the
  file is read whatever the pair, so a broken one fails at once); else,
  for a known architecture, ``<settings.tuning_dir>/<file_name>``, then the
  shipped ``SHIPPED_DIR/<file_name>``; else no table (the default rule).
  Each file is read once and again only after its mtime or size changes.
  The result is remembered per (architecture, ranks), replacing an earlier
  one, for ``jax_llar.status()`` (`tables_seen`; `clear_cache` forgets).

  Args:
    architecture: e.g. ``"sm_90"`` (`architecture_name`); None when unknown
      (devices that are not CUDA GPUs): only a forced file could serve, and
      it never names None, so the default rule decides.
    ranks: ranks per replica group. Not checked: a number no table can hold
      (outside 2..MAX_RANKS) finds no file and gets the default rule.

  Returns:
    a `Lookup`: origin ``"file"``, ``"user"`` or ``"shipped"`` with the
    table and its path in ``note``, or ``"default"`` with table None and in
    ``note`` why there is none.

  Raises:
    TuningTableError: settings.tuning_file names a missing or broken file,
      or a directory or another file that is not regular (checked whatever
      the pair; never opened), or the file for the pair in the tuning
      directory or among the shipped tables is broken, not a regular file,
      or holds another pair's table (its name says one pair, its content
      another). The message names the file and the setting or directory to
      fix.

  Example::

    >>> found = lookup("sm_90", 2)  # with no user table: the shipped one
    >>> found.origin, found.table.label
    ('shipped', 'sm_90 x 2 ranks')
    >>> lookup("sm_80", 4).note
    'no tuning table for sm_80 x 4 ranks'
  """
  found = _lookup(architecture, ranks)
  with _lock:
    _seen[(architecture, ranks)] = found
  return found


def for_devices(devices: Iterable, ranks: int) -> Lookup:
  """`lookup` for a psum over `ranks` ranks on `devices` (every device of
  its replica groups).

  The architecture is `architecture_of` each device (None for one that is
  not a CUDA GPU). When all agree (or `devices` is empty: None), this is
  ``lookup(architecture, ranks)``. Devices of several architectures (a
  mix of known ones, or known and None) get no table and a
  `Lookup.refusal`, because one psum takes one decision for all of its
  devices: the lowering then falls back to lax.psum (dispatch reason
  ``"architecture"``). That Lookup (architecture None, origin
  ``"default"``) is remembered for ``jax_llar.status()`` under
  (None, ranks); no file is read for it.

  Args:
    devices: the ``jax.Device`` objects (anything with ``platform`` and, for
      GPUs, ``compute_capability``); iterated once.
    ranks: ranks per replica group.

  Returns:
    a `Lookup`, as `lookup` gives it, or the refusal above.

  Raises:
    TuningTableError: as `lookup` (not for devices of several
      architectures, which read no file).

  Example::

    >>> for_devices(jax.devices("cpu"), 2).note  # doctest: +SKIP
    'architecture unknown (the devices are not CUDA GPUs)'
  """
  archs = {architecture_of(d) for d in devices}
  if len(archs) > 1:
    names = ", ".join(sorted(a or "unknown" for a in archs))
    found = Lookup(None, ranks, None, "default",
                   f"devices of several architectures ({names})",
                   refusal=f"the devices of the replica groups differ in "
                           f"architecture ({names}): one psum needs one decision "
                           "for all of them")
    with _lock:
      _seen[(None, ranks)] = found
    return found
  return lookup(archs.pop() if archs else None, ranks)


def tables_seen() -> list[dict[str, Any]]:
  """What ``jax_llar.status()`` reports: per (architecture, ranks) that a
  lowering looked up, the table in use (origin, path, rows, provenance
  summary) or the default rule and why; sorted by architecture and ranks."""
  with _lock:
    found = list(_seen.values())
  return [f.to_dict() for f in sorted(found, key=lambda f: (f.architecture or "", f.ranks))]


def shipped() -> list[str]:
  """Names of the shipped table files."""
  return sorted(p.name for p in SHIPPED_DIR.glob("*ranks.json"))


def clear_cache() -> None:
  """Forgets the tables read and the pairs looked up (a test's, or after
  writing a table in this process)."""
  with _lock:
    _files.clear()
    _seen.clear()
