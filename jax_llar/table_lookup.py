"""Which tuning table serves a psum (the tables' format: ``jax_llar.tuning``).

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
``jax_llar.tuning.TuningTableError``, naming the file, from the lowering
that reads it.
"""

from __future__ import annotations

import dataclasses
import os
import stat
import threading
from typing import Any, Iterable

from jax_llar import jsonfile, policy, tuning
from jax_llar.algorithms import MAX_BYTES
from jax_llar.config import settings

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
    raise tuning.table_error(path, problem, hint)
  try:
    st = os.stat(path)
  except OSError as e:  # gone since
    raise tuning.table_error(path, f"cannot be read: {e.strerror or e}", hint) from None
  key = (st.st_mtime_ns, st.st_size)
  with _lock:
    hit = _files.get(path)
  if hit is not None and hit[0] == key:
    return hit[1]
  table = tuning.load(path, hint=hint)
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
  name = tuning.file_name(architecture, ranks)
  for origin, directory, hint in (
      ("user", os.path.expanduser(settings.tuning_dir),
       "the tuning directory, JAX_LLAR_TUNING_DIR: fix, delete or re-run "
       "python -m jax_llar.tools.tune"),
      ("shipped", str(tuning.SHIPPED_DIR), "shipped with jax_llar: reinstall it")):
    path = os.path.abspath(os.path.join(directory, name))
    try:
      mode = os.stat(path).st_mode
    except (OSError, ValueError):  # none there (or the directory unreadable)
      continue
    if not stat.S_ISREG(mode):  # a directory or a FIFO of the table's name
      raise tuning.table_error(path, jsonfile.file_kind(mode), hint)
    table = _read(path, hint)
    if (table.architecture, table.ranks) != (architecture, ranks):
      raise tuning.table_error(path, f"holds the table for {table.label}, but its name is for "
                  f"{architecture} x {ranks} ranks", hint)
    return Lookup(architecture, ranks, table, origin, path)
  return Lookup(architecture, ranks, None, "default",
                f"no tuning table for {architecture} x {ranks} ranks")


def lookup(architecture: str | None, ranks: int) -> Lookup:
  """The table that serves psums over `ranks` ranks on GPUs of
  `architecture`, by the precedence of the module docstring.

  In order: ``settings.tuning_file`` when it holds this pair's table (the
  file is read whatever the pair, so a broken one fails at once); else,
  for a known architecture, ``<settings.tuning_dir>/<tuning.file_name>``,
  then the shipped ``tuning.SHIPPED_DIR/<tuning.file_name>``; else no table
  (the default rule).
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

  The architecture is ``tuning.architecture_of`` each device (None for one
  that is not a CUDA GPU). When all agree (or `devices` is empty: None), this is
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
  archs = {tuning.architecture_of(d) for d in devices}
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
  return sorted(p.name for p in tuning.SHIPPED_DIR.glob("*ranks.json"))


def clear_cache() -> None:
  """Forgets the tables read and the pairs looked up (a test's, or after
  writing a table in this process)."""
  with _lock:
    _files.clear()
    _seen.clear()
