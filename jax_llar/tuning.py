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

Building a table (`build_tables`, shared by ``python -m jax_llar.tools.tune``
and its ``--from_results`` mode): from JAX-level result files (rows of
``jax_llar.tools.jax_level``: per implementation, dtype and size, the
per-step time of a jitted chain and whether its output was bitwise correct),
per number of ranks, per size, the rule `RULE` picks an implementation;
neighbouring sizes with the same pick merge into one row. Rows of the
non-deterministic algorithms (``jax_llar.algorithms.NON_DETERMINISTIC``:
floating-point atomics) are left out before anything else (their output is
not bitwise any reference, and a table never chooses them); the table's
provenance note names them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import pathlib
import re
import stat
import threading
from typing import Any, Iterable, Mapping, Sequence

from jax_llar import policy
from jax_llar.algorithms import (MAX_BYTES, MAX_RANKS, NEEDS_STORE_ATOMICITY, NON_DETERMINISTIC,
                                 SIGNED, Algorithm)
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


# The deepest nesting of JSON arrays and objects that the readers of tables
# and result files take (a table nests 5 deep, a result file about as
# much). Checked by a scan that does not recurse, before json.loads, whose
# parser recurses once per level (200 thousand `[` would raise RecursionError).
MAX_JSON_DEPTH = 64

# A JSON string (or the rest of the text, for an unterminated one), or a
# bracket outside strings.
_JSON_TOKENS = re.compile(r'"[^"\\]*(?:\\[\s\S][^"\\]*)*(?:"|\\?\Z)|[\[\]{}]')


class TuningTableError(ValueError):
  """A tuning table file that cannot be used; the message names the file."""


class TuningBuildError(ValueError):
  """Result files from which no table can be built; the message says why."""


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


class _Unreadable(ValueError):
  """A file that `_read_json` cannot give: the message says why, to follow
  the file's path ("is a directory, not a file")."""


def _kind(mode: int) -> str:
  """What a file that is no regular file is, for a message."""
  if stat.S_ISDIR(mode):
    return "is a directory, not a file"
  for test, name in ((stat.S_ISFIFO, "a FIFO, a named pipe"), (stat.S_ISSOCK, "a socket"),
                     (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
    if test(mode):
      return f"is not a regular file ({name})"
  return "is not a regular file"


def _file_problem(path: str) -> str | None:
  """Why `path` is no regular file that can be read, from ``os.stat`` alone
  (nothing is opened, so a FIFO cannot block); None when it is one."""
  try:
    st = os.stat(path)
  except FileNotFoundError:
    return "does not exist"
  except NotADirectoryError:
    return "does not exist (a part of its path is not a directory)"
  except (OSError, ValueError) as e:
    return f"cannot be read: {getattr(e, 'strerror', None) or e}"
  return None if stat.S_ISREG(st.st_mode) else _kind(st.st_mode)


def _too_deep(text: str, limit: int = MAX_JSON_DEPTH) -> bool:
  """Whether the arrays and objects of the JSON `text` nest deeper than
  `limit`; a loop over its brackets outside strings, never a recursion."""
  depth = 0
  for m in _JSON_TOKENS.finditer(text):
    c = m.group()
    if c in "[{":
      depth += 1
      if depth > limit:
        return True
    elif c in "]}":
      depth -= 1
  return False


def _read_json(path: str) -> tuple[Any, bytes]:
  """(the parsed JSON, the file's bytes) of the regular file `path`.

  Never blocks on a FIFO or a device: the path is checked with ``os.stat``
  first, opened non-blocking, and checked again on the open file. Never
  recurses deeply: nesting beyond `MAX_JSON_DEPTH` is refused before
  parsing.

  Raises:
    _Unreadable: missing, a directory or another file that is not regular,
      unreadable, not UTF-8 JSON, or nested too deeply.
  """
  problem = _file_problem(path)
  if problem is not None:
    raise _Unreadable(problem)
  flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
  try:
    fd = os.open(path, flags)
  except OSError as e:
    raise _Unreadable(f"cannot be read: {e.strerror or e}") from None
  try:
    with os.fdopen(fd, "rb") as f:
      mode = os.fstat(f.fileno()).st_mode
      if not stat.S_ISREG(mode):  # replaced since the check above
        raise _Unreadable(_kind(mode))
      raw = f.read()
  except OSError as e:
    raise _Unreadable(f"cannot be read: {e.strerror or e}") from None
  try:
    text = raw.decode("utf-8")
  except UnicodeDecodeError as e:
    raise _Unreadable(f"is not JSON: not UTF-8 ({e})") from None
  deep = (f"is not JSON that jax_llar reads: its arrays and objects nest deeper "
          f"than {MAX_JSON_DEPTH} levels")
  if _too_deep(text):
    raise _Unreadable(deep)
  try:
    return json.loads(text), raw
  except RecursionError:  # not reached within the bound; kept as a guard
    raise _Unreadable(deep) from None
  except ValueError as e:
    raise _Unreadable(f"is not JSON: {e}") from None


def _short(value: Any, limit: int = 40) -> str:
  """`value`'s repr for a message, cut to about `limit` characters."""
  text = repr(value)
  return text if len(text) <= limit else text[:limit] + "..."


def _json_kind(value: Any) -> str:
  """What a JSON value is, for a message."""
  if value is None:
    return "null"
  for kind, name in ((bool, "a boolean"), (dict, "an object"), (list, "an array"),
                     (str, "a string"), ((int, float), "a number")):
    if isinstance(value, kind):
      return name
  return type(value).__name__


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
      deeper than `MAX_JSON_DEPTH`, or breaks the format (`from_dict`); the
      message starts ``"jax_llar tuning table <path>: "`` and says which.

  Example::

    >>> t = load(SHIPPED_DIR / "sm_90-2ranks.json")
    >>> t.label, [(r.max_bytes, r.name) for r in t.rows]
    ('sm_90 x 2 ranks', [(262144, 'one_shot_ll')])
  """
  path = os.fspath(path)
  try:
    data, _ = _read_json(path)
  except _Unreadable as e:
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
  problem = _file_problem(path)
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
    table = _read(path, hint)  # missing, a directory, a FIFO...: says which  # read for every pair: a broken file fails early
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
      raise _fail(path, _kind(mode), hint)
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


# --- building tables from measurements -----------------------------------------


def _read_results(path: str) -> tuple[dict[str, Any], str]:
  """(the JSON object, its SHA-256) of the result file `path`.

  Raises:
    TuningBuildError: `_read_json`'s problems, or not a JSON object.
  """
  try:
    data, raw = _read_json(os.fspath(path))
  except _Unreadable as e:
    raise TuningBuildError(f"{path}: {e}") from None
  if not isinstance(data, dict):
    raise TuningBuildError(f"{path}: is not a result file: a JSON object, got "
                           f"{_json_kind(data)}")
  return data, hashlib.sha256(raw).hexdigest()


def read_results(path) -> dict[str, Any]:
  """The JSON object of a result file (a JAX-level or tune result, a
  store-atomicity record), read as the table files are: a FIFO or a device
  is never opened, and nesting beyond `MAX_JSON_DEPTH` is refused before
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
    raise TuningBuildError(f"{path}: {where}{key} must be {name}, got {_json_kind(value)}")
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
                             f"{_json_kind(row)}")
  arch = result.get("architecture")
  if arch and not isinstance(arch, str):
    raise TuningBuildError(f"{path}: architecture must be a string, got {_json_kind(arch)}")
  return result


def _positive_int(value: Any) -> bool:
  return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _nccl(code) -> str | None:
  if not isinstance(code, int) or code <= 0:
    return None
  return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"


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
                                 f"{_json_kind(row[key])} {_short(row[key])}")
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
