"""What jax_llar can do in this process, and what went wrong."""

from __future__ import annotations

from typing import Any

import jax

from jax_llar import _ext, comm, lowering, swap, tuning
from jax_llar.config import settings


def status() -> dict[str, Any]:
  """Describes the fast path in this process; logs and prints nothing.

  Loads the extension if that was not tried yet (which starts JAX's
  backends), quietly: an untested (jax, NCCL) pair is reported by the first
  lowering that uses the extension, not here.

  Returns:
    dict with
      ``built``: the CUDA extension is compiled into this installation;
      ``active``: it is loaded and usable in this process;
      ``reason``: why not (str), or None when active;
      ``nccl_runtime``: NCCL_VERSION_CODE of the libnccl.so.2 in use (e.g.
        22809 for 2.28.9), or None when not active;
      ``nccl_compiled``: NCCL_VERSION_CODE of the headers the kernels were
        compiled against, or None without a CUDA build;
      ``nccl_library``: path of the libnccl.so.2 in use, or None;
      ``build``: the build's record (``nccl_version_code``,
        ``cuda_version``, ``cuda_architectures``), or None without a CUDA
        build;
      ``versions``: readable versions: ``jax``, ``nccl_runtime`` and
        ``nccl_compiled`` as "2.28.9" strings (None where unknown), and
        ``tested_pair``: whether (jax, NCCL runtime) is a pair the GPU suite
        and the benchmarks ran with (None when not active);
      ``comm_sets``: one dict per communicator set (``comm_id``, ``groups``
        of CUDA ordinals, ``world_size``, ``regions``: the algorithms whose
        scratch regions it holds, allocated when a lowering first picked
        them, ``scratch_bytes_per_device``: their sum);
      ``settings``: the current ``jax_llar.config.settings`` as a dict;
      ``tuning``: the tuning tables (``jax_llar.tuning``): ``tuning_file``
        and ``tuning_dir`` (as set), ``shipped`` (file names of the tables
        shipped with jax_llar), and ``tables``: one dict per (architecture,
        ranks) a lowering has looked up, with ``architecture``, ``ranks``,
        ``origin`` ("file", "user", "shipped" or "default"), ``path``,
        ``rows`` (``max_bytes``, ``algorithm``) and ``provenance`` (the
        command, result files, commit, date, GPU, jax and NCCL versions and
        the note of what was not measured); for the default rule ``note``
        (why no table) and ``rule`` instead of path, rows and provenance;
      ``swap``: ``installed`` (the process-wide swap is on) and
        ``lowering_rules`` (per psum primitive, whether jax_llar's lowering
        rule is still the registered one).
  """
  mod = _ext.load(quiet=True)
  build = _ext.build_info()
  if build is not None:
    nccl_compiled = build["nccl_version_code"]
  else:
    nccl_compiled = mod.nccl_compiled_version() if mod else None
  nccl_runtime = mod.nccl_runtime_version() if mod else None
  versions = {
      "jax": jax.__version__,
      "nccl_runtime": (_ext.nccl_version_string(nccl_runtime)
                       if nccl_runtime is not None else None),
      "nccl_compiled": (_ext.nccl_version_string(nccl_compiled)
                        if nccl_compiled is not None else None),
      "tested_pair": ((jax.__version__, nccl_runtime) in _ext.TESTED_VERSIONS
                      if nccl_runtime is not None else None),
  }
  return {
      "built": _ext.built(),
      "active": mod is not None,
      "reason": _ext.reason() if mod is None else None,
      "nccl_runtime": nccl_runtime,
      "nccl_compiled": nccl_compiled,
      "nccl_library": _ext.nccl_library_path() if mod else None,
      "build": build,
      "versions": versions,
      "comm_sets": [
          {"comm_id": c.comm_id, "groups": c.groups, "world_size": c.world_size,
           "regions": [a.short_name for a in c.regions],
           "scratch_bytes_per_device": c.scratch_bytes}
          for c in comm.comm_sets()
      ],
      "settings": vars(settings).copy(),
      "tuning": {"tuning_file": settings.tuning_file or None,
                 "tuning_dir": settings.tuning_dir,
                 "shipped": tuning.shipped(),
                 "tables": tuning.tables_seen()},
      "swap": {"installed": swap.installed(),
               "lowering_rules": lowering.rules_active()},
  }


def error_reports() -> list[dict[str, Any]]:
  """Timeout reports of the bounded device-side waits.

  A wait that exceeds ``settings.timeout_ms`` writes (rank, peer, block, line,
  epoch, flags seen) to host-mapped memory and traps, which fails the XLA
  call. Call this after catching the error to see what the kernel waited
  for.

  Returns:
    One dict per report (``comm_id``, ``device``, ``code``, ``rank``,
    ``peer``, ``block``, ``line``, ``epoch``, ``flag_expected``,
    ``flag_seen`` (a pair), ``waited_ns``); empty when nothing timed out or
    the extension was never loaded. Loads nothing.
  """
  mod = _ext.loaded()
  return list(mod.error_reports()) if mod else []
