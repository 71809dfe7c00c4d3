"""What jax_llar can do in this process, and what went wrong."""

from __future__ import annotations

from typing import Any

import jax

from jax_llar import _ext, algorithms, comm, lowering, signature, swap, table_lookup
from jax_llar.reports import decode_report
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
        them, ``scratch_bytes_per_device``: their sum, the regions kept by a
        set that was given up included (never freed: registry.h, ScratchBytesOf));
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
        rule is still the registered one);
      ``signatures``: ``enabled`` (``settings.signatures``), ``signed`` (the
        algorithms whose lines carry them, ``algorithms.SIGNED``) and
        ``lowered`` (how many distinct call signatures this process lowered;
        ``jax_llar.signature.lowered()`` maps each to its calls).
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
                 "shipped": table_lookup.shipped(),
                 "tables": table_lookup.tables_seen()},
      "swap": {"installed": swap.installed(),
               "lowering_rules": lowering.rules_active()},
      "signatures": {"enabled": settings.signatures,
                     "signed": sorted(a.short_name for a in algorithms.SIGNED),
                     "lowered": len(signature.lowered())},
  }


def error_reports() -> list[dict[str, Any]]:
  """Reports of the bounded device-side waits that failed a call.

  A wait that exceeds ``settings.timeout_ms`` (code 1, "timeout"), or that
  finds a peer's line of its own epoch carrying another call's signature
  (code 2, "foreign signature": the GPUs did not run the same sequence of
  jax_llar calls, ``jax_llar.signature``), writes what it waited for to
  host-mapped memory and traps, which fails the XLA call. The trap loses the
  CUDA context of that device: the process must be restarted. The reports
  stay readable; call this after catching the error.

  Returns:
    One dict per report (``jax_llar.reports.decode_report``): ``comm_id``, ``device``,
    ``code``, ``what`` (the code's name), ``rank`` (that waited), ``peer``
    (whose line it waited for, or whose line was foreign), ``block``,
    ``line``, ``epoch``, ``flag_expected``, ``flag_seen`` (a pair),
    ``waited_ns``, ``signature_expected`` (the waiting call's),
    ``signature_seen`` (of the line last read), ``flag_epoch_bits``,
    ``epoch_bits_expected`` and ``epoch_bits_seen`` (the epoch's bits of
    the flags, None for a protocol without signatures), ``calls_expected``
    and ``calls_seen`` (op names of the calls lowered in this process that
    carry those signatures) and ``message`` (a sentence). Empty when no wait
    failed or the extension was never loaded. Loads nothing.

  Example, after a failed step::

    for r in jax_llar.error_reports():
      print(r["message"])
  """
  mod = _ext.loaded()
  return [decode_report(r) for r in mod.error_reports()] if mod else []
