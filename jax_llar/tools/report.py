"""Result files, their environment block, plots and tables.

Every tool writes one JSON shape: ``{"env": {...}, "level": "kernel" | "jax"
| "loop" | "app" | "sol", "rows": [{"impl", "world_size", "dtype",
"bytes_per_rank", "us_per_call", "correct", ...}]}`` (an application row has
``metric`` and ``value`` instead of the last three; a loop row adds
``structure`` and ``xla_flags``), named
``<machine>-<yyyymmdd>-<level><tag>.json`` plus a PNG plot where matplotlib
is installed. The method is described in benchmarks/METHOD.md in the
repository.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from typing import Any, Callable, Iterable

# Impl names whose columns lead the JAX-level table, in this order.
JAX_TABLE_LEAD = ("lax.psum", "ffi.copy", "llar.one_shot_ll")
LLAR, COPY, PSUM = "llar.one_shot_ll", "ffi.copy", "lax.psum"


# Help text of every tool's --out flag (its default is default_out_dir()).
OUT_HELP = ("Folder for the result files (default: jax_llar_results in the temporary "
            "folder, TMPDIR). Pass --out=benchmarks/results to add a run to the "
            "repository's results.")


def default_out_dir() -> str:
  """Scratch folder for results: ``$TMPDIR/jax_llar_results`` (the system's
  temporary folder when TMPDIR is unset). Tracked results are written only
  when a tool is given ``--out benchmarks/results``."""
  return os.path.join(tempfile.gettempdir(), "jax_llar_results")


def git_commit() -> str | None:
  """The HEAD commit of the checkout this package runs from, or None (not a
  git checkout, or git missing). ``LLAR_GIT_COMMIT`` overrides it."""
  if os.environ.get("LLAR_GIT_COMMIT"):
    return os.environ["LLAR_GIT_COMMIT"]
  try:
    return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.abspath(__file__)),
                          timeout=10).stdout.strip() or None
  except (OSError, subprocess.SubprocessError):
    return None


def environment() -> dict[str, Any]:
  """The environment block of a result file: date (UTC), jax and jaxlib
  versions, Python, devices (kinds and compute capabilities), ``XLA_FLAGS``,
  git commit, nvidia-smi's GPU
  names and driver, the CUDA platform version, NCCL runtime and compiled
  versions, the NCCL library path, and the extension's build record (NCCL
  headers, CUDA version and architectures; None without a CUDA build).
  Starts JAX's backends."""
  import jax
  import jax_llar
  env: dict[str, Any] = {
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
      "jax": jax.__version__,
      "python": platform.python_version(),
      "devices": [d.device_kind for d in jax.devices()],
      # CUDA devices' compute capabilities ("9.0"); None for other devices.
      "compute_capabilities": [getattr(d, "compute_capability", None)
                               for d in jax.devices()],
      "device_count": jax.device_count(),
      "xla_flags": os.environ.get("XLA_FLAGS", ""),
      "git_commit": git_commit(),
  }
  try:
    import jaxlib
    env["jaxlib"] = jaxlib.__version__
  except ImportError:
    env["jaxlib"] = None
  try:
    q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                        "--format=csv,noheader"], capture_output=True, text=True,
                       timeout=30)
    env["nvidia_smi"] = q.stdout.strip().splitlines()
  except (OSError, subprocess.SubprocessError):
    env["nvidia_smi"] = None
  try:
    env["cuda_runtime_platform"] = jax.devices()[0].client.platform_version
  except Exception:  # noqa: BLE001 - informational only
    pass
  st = jax_llar.status()
  for key in ("nccl_runtime", "nccl_compiled", "nccl_library"):
    env[key] = st.get(key)
  env["build"] = st.get("build")  # CUDA version and architectures of the build
  return env


def machine_name() -> str:
  """Short machine name for result files: device kind and count, e.g.
  ``h200x2`` or ``cpux2``."""
  import jax
  kind = jax.devices()[0].device_kind.lower().replace("nvidia ", "").replace(" ", "")
  return f"{kind}x{jax.device_count()}"


def stem(level: str, tag: str = "") -> str:
  """``<machine>-<yyyymmdd>-<level><tag>``."""
  return f"{machine_name()}-{datetime.date.today():%Y%m%d}-{level}{tag}"


def plot(rows: Iterable[dict], path: str, title: str) -> None:
  """Log-log plot of us_per_call against bytes_per_rank, one line per impl,
  one panel per dtype, saved as PNG at `path`.

  Raises:
    ImportError: when matplotlib is not installed.
  """
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  rows = [r for r in rows if "bytes_per_rank" in r and "us_per_call" in r]
  dtypes = sorted({r["dtype"] for r in rows})
  if not dtypes:
    return
  fig, axes = plt.subplots(1, len(dtypes), figsize=(6 * len(dtypes), 4.5), squeeze=False)
  for ax, dt in zip(axes[0], dtypes):
    for impl in sorted({r["impl"] for r in rows}):
      pts = sorted((r["bytes_per_rank"], r["us_per_call"]) for r in rows
                   if r["impl"] == impl and r["dtype"] == dt)
      if pts:
        ax.plot([p[0] for p in pts], [max(p[1], 1e-2) for p in pts], "o-", label=impl)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("bytes per rank")
    ax.set_ylabel("us per step or call")
    ax.set_title(f"{title} {dt}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def _unused_name(out_dir: str, name: str) -> str:
  """`name`, or `name`-N with the smallest N >= 2 for which neither the
  .json nor the .png exists in `out_dir`."""
  candidate, n = name, 1
  while any(os.path.lexists(os.path.join(out_dir, candidate + ext))
            for ext in (".json", ".png")):
    n += 1
    candidate = f"{name}-{n}"
  return candidate


def _temp_beside(path: str) -> str:
  """A new empty temporary file in `path`'s folder (same file system, so
  that a rename onto `path` is atomic), hidden, with `path`'s extension (a
  plotter picks the format from it); returns its path."""
  fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".tmp-",
                             suffix=os.path.splitext(path)[1],
                             dir=os.path.dirname(os.path.abspath(path)))
  os.close(fd)
  return tmp


def write_atomic(path: str, write: Callable[[str], bool | None],
                 overwrite: bool = True) -> bool:
  """Writes a file atomically: `write(tmp)` fills a temporary file in the
  same folder, which then takes the name `path` in one step (os.replace, or
  with ``overwrite=False`` a hard link that fails when `path` exists), so
  that a reader never sees a partial file and a failure leaves none. The
  temporary file is removed in every case. Returns False, writing nothing,
  when `write` returns False or leaves the file empty; else True.

  Raises:
    FileExistsError: with ``overwrite=False`` when `path` exists.
    OSError: when the folder cannot be written.
  """
  tmp = _temp_beside(path)
  try:
    if write(tmp) is False or os.path.getsize(tmp) == 0:
      return False
    os.chmod(tmp, 0o666 & ~_umask())  # as open() would have created it
    if overwrite:
      os.replace(tmp, path)
      tmp = None
    else:
      try:
        os.link(tmp, path)  # atomic, and never replaces an existing file
      except FileExistsError:
        raise
      except OSError:  # a file system without hard links
        if os.path.lexists(path):
          raise FileExistsError(path) from None
        os.replace(tmp, path)
        tmp = None
    return True
  finally:
    if tmp is not None and os.path.lexists(tmp):
      os.unlink(tmp)


_UMASK: list[int] = []


def _umask() -> int:
  """The process's umask (read once: reading it means setting it)."""
  if not _UMASK:
    mask = os.umask(0o022)
    os.umask(mask)
    _UMASK.append(mask)
  return _UMASK[0]


def write_json(path: str, doc: Any, overwrite: bool = True) -> None:
  """`doc` as indented JSON (``default=str``), written with `write_atomic`."""
  text = json.dumps(doc, indent=1, default=str)

  def write(tmp: str) -> None:
    with open(tmp, "w") as f:
      f.write(text)

  write_atomic(path, write, overwrite)


def save(result: dict, out_dir: str, name: str, plot_title: str | None = None,
         plotter: Callable[[Iterable[dict], str, str], None] | None = None) -> list[str]:
  """Writes `result` to ``out_dir/name.json`` and, with `plot_title`, a plot
  to ``out_dir/name.png`` (``plotter(rows, path, title)``, by default
  `plot`); creates `out_dir`. Never overwrites: when either
  file exists, the name gets a suffix ``-2``, ``-3``, ... (result files are a
  record). Both files are written atomically (`write_atomic`): a failure
  leaves no partial file. Returns the paths written.
  Without matplotlib it says how to install it on stderr and writes no
  plot; a plot that fails is said so on stderr, the JSON kept."""
  os.makedirs(out_dir, exist_ok=True)
  for _ in range(1000):
    name = _unused_name(out_dir, name)
    path = os.path.join(out_dir, name + ".json")
    try:
      write_json(path, result, overwrite=False)
      break
    except FileExistsError:  # taken since _unused_name looked: the next one
      continue
  else:
    raise FileExistsError(f"no free result name for {name} in {out_dir}")
  paths = [path]
  if plot_title is not None:
    png = os.path.join(out_dir, name + ".png")
    try:
      draw = plotter or plot
      if write_atomic(png, lambda tmp: draw(result["rows"], tmp, plot_title)):
        paths.append(png)
    except ImportError:
      print("matplotlib is not installed: no plot (pip install 'jax_llar[bench]')",
            file=sys.stderr)
    except Exception as e:  # noqa: BLE001 - the plot adds to the saved result
      print(f"no plot: {type(e).__name__}: {e}", file=sys.stderr)
  return paths


def mark(r: dict | None) -> str:
  """A result row's mark in a table: "!" when its output matched no
  reference, "*" when it did not take the fast path."""
  if r is None:
    return ""
  return ("" if r["correct"] else "!") + ("*" if r.get("fast_path") is False else "")


def print_jax_table(rows: list[dict]) -> None:
  """Prints the JAX-level table: per dtype and size, each impl's per-step
  slope with its range over rounds; with lax.psum, ffi.copy and
  llar.one_shot_ll all present and jax_llar on its fast path, also
  llar - copy, lax.psum / llar and the device-period differences; then, if
  there are lax.psum+<flag> rows, a second table of those."""
  by: dict = {}
  for r in rows:
    by.setdefault((r["dtype"], r["bytes_per_rank"]), {})[r["impl"]] = r
  flag_impls = sorted({r["impl"] for r in rows if r["impl"].startswith("lax.psum+")})
  impls = [i for i in JAX_TABLE_LEAD if any(i in v for v in by.values())]
  impls += sorted({r["impl"] for r in rows} - set(impls) - set(flag_impls))
  trio = {LLAR, COPY, PSUM} <= set(impls)
  # A jax_llar column none of whose rows took the fast path ran lax.psum: its
  # header says so, not only the '*' of its cells.
  fell_back = {i for i in impls if i.startswith("llar.") and all(
      r.get("fast_path") is False for r in rows if r["impl"] == i)}
  labels = [f"{i}=lax.psum" if i in fell_back else i for i in impls]
  head = f"{'dtype':9s} {'bytes':>8s} " + " ".join(f"{i:>22s}" for i in labels)
  if trio:
    head += (f" {'llar-copy':>10s} {'psum/llar':>10s} {'dev llar-copy':>14s}"
             f" {'mean llar-copy':>15s}")
  print(head)
  for (dt, b), v in sorted(by.items()):
    cells = []
    for i in impls:
      r = v.get(i)
      cells.append(f"{r['us_per_call']:8.2f} [{r['us_round_min']:5.1f},{r['us_round_max']:5.1f}]"
                   f"{mark(r)}" if r else f"{'-':>22s}")
    line = f"{dt:9s} {b:8d} " + " ".join(f"{c:>22s}" for c in cells)
    if all(i in v for i in (LLAR, COPY, PSUM)) and v[LLAR].get("fast_path"):
      ll, cp, ps = (v[i]["us_per_call"] for i in (LLAR, COPY, PSUM))
      line += f" {ll - cp:10.2f} {ps / ll if ll > 0 else float('nan'):10.1f}"
      dl, dc = v[LLAR].get("device_period_us"), v[COPY].get("device_period_us")
      line += f" {dl - dc:14.2f}" if dl and dc else f" {'-':>14s}"
      ml, mc = v[LLAR].get("device_mean_period_us"), v[COPY].get("device_mean_period_us")
      line += f" {ml - mc:15.2f}" if ml and mc else f" {'-':>15s}"
    print(line)
  print("(us per step: median-of-all slope [min, max over rounds]; '!' = the "
        "result matched no reference; '*' = jax_llar fell back to lax.psum, so "
        "no ratio is printed; 'dev llar-copy': difference of the median per-step "
        "device periods read from a profiler trace; 'mean llar-copy': the same "
        "with mean periods, which include the GPUs' stalls)")
  refs = sorted({(r["impl"], r["dtype"], r.get("reference")) for r in rows})
  if refs:
    print("references matched (impl, dtype: reference): " + "; ".join(
        f"{i} {d}: {ref or 'none'}" for i, d, ref in refs))
    print("(references: 'rounded' = every step rounded to the dtype, its sum in rank "
          "order (float64, rounded once), as a program with a custom call between "
          "steps must compute; 'excess_f32' = intermediates kept in float32, which "
          "XLA's CPU backend may do for 16-bit types; 'psum_rounded', "
          "'psum_excess_f32' = the same with every step's sum JAX's own, from a "
          "separate one-step lax.psum in the same run (lax.psum promises no "
          "summation order); 'lax.psum' = equal to the lax.psum chain, the contract "
          "of a psum that fell back to it)")
  if any(r["impl"] == COPY for r in rows) and not any(r.get("fast_path") for r in rows):
    print("(no GPU: ffi.copy lowers to nothing here, so its chain is the multiplies "
          "alone and its slope is about 0 us per step)")
  if not flag_impls:
    return
  print("lax.psum under XLA flags (us per step; 'best psum/llar' takes the "
        "fastest lax.psum variant of the row, default flags included):")
  for i, f in enumerate(flag_impls):
    print(f"  [{i}] {f}")
  print(f"{'dtype':9s} {'bytes':>8s} " +
        " ".join(f"{'[' + str(i) + ']':>8s}" for i in range(len(flag_impls))) +
        f" {'best psum/llar':>15s}")
  for (dt, b), v in sorted(by.items()):
    cells = [f"{v[f]['us_per_call']:8.2f}" if f in v else f"{'-':>8s}" for f in flag_impls]
    psums = [v[f]["us_per_call"] for f in [PSUM] + flag_impls if f in v and v[f]["correct"]]
    ll = v.get(LLAR)
    ratio = (f"{min(psums) / ll['us_per_call']:15.1f}"
             if psums and ll and ll.get("fast_path") and ll["us_per_call"] > 0
             else f"{'-':>15s}")
    print(f"{dt:9s} {b:8d} " + " ".join(cells) + " " + ratio)

