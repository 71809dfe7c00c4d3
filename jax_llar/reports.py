"""The reports of the bounded device-side waits that failed a call, decoded.

A kernel's wait that exceeds the timeout, or meets a peer's line of its own
epoch carrying another call's signature, writes an ``ErrorRecord``
(ffi/include/llar/args.h, wait.cuh) and traps; the extension returns the
records as dicts (``jax_llar._llar.error_reports()``). `decode_report` adds
what they mean; ``jax_llar.error_reports()`` (jax_llar.status) returns them,
and the extension's loader prints them at exit.
"""

from __future__ import annotations

from typing import Any

from jax_llar import signature

# ErrorRecord::code (ffi/include/llar/args.h, wait.cuh) -> its name.
ERROR_CODES = {1: "timeout", 2: "foreign signature"}


def decode_report(raw: dict[str, Any]) -> dict[str, Any]:
  """`raw` (one report as the extension returns it) with the decoded fields
  of `error_reports` added. Pure apart from reading the signatures lowered in
  this process (``jax_llar.signature.calls``)."""
  r = dict(raw)
  code = int(r.get("code", 0))
  r["what"] = ERROR_CODES.get(code, f"code {code}")
  bits = int(r.get("flag_epoch_bits") or 0)
  seen = r.get("flag_seen") or (0, 0)
  if bits:
    mask = (1 << bits) - 1
    r["epoch_bits_expected"] = int(r.get("flag_expected", 0)) & mask
    r["epoch_bits_seen"] = int(seen[0]) & mask
  else:
    r["epoch_bits_expected"] = r["epoch_bits_seen"] = None
  for key in ("expected", "seen"):
    sig = int(r.get(f"signature_{key}") or 0)
    r[f"calls_{key}"] = sorted({c.op_name for c in signature.calls(sig)}) if sig else []
  r["message"] = report_message(r)
  return r


def _call(r: dict[str, Any], key: str) -> str:
  sig = int(r.get(f"signature_{key}") or 0)
  names = r.get(f"calls_{key}") or []
  if not sig:
    return "no signature"
  return f"signature {sig}" + (f" ({', '.join(names)})" if names else "")


def report_message(r: dict[str, Any]) -> str:
  """One sentence for a decoded report (`decode_report`)."""
  where = (f"on CUDA device {r.get('device')}: rank {r.get('rank')}, block "
           f"{r.get('block')}, line {r.get('line')}, epoch {r.get('epoch')}")
  restart = ("The kernel trapped, so this device's CUDA context is lost: restart "
             "the process.")
  if r.get("code") == 2:
    return (f"jax_llar: a mispaired call {where}: its call, {_call(r, 'expected')}, "
            f"found rank {r.get('peer')}'s line of the same epoch from another call, "
            f"{_call(r, 'seen')}. The GPUs did not run the same sequence of jax_llar "
            "calls (programs dispatched from several threads onto the same devices, "
            "or a call that only some ranks make). " + restart)
  waited = r.get("waited_ns") or 0
  return (f"jax_llar: a bounded wait timed out after {waited / 1e6:.0f} ms {where}: "
          f"rank {r.get('peer')}'s line never arrived ({_call(r, 'expected')}; flag "
          f"{r.get('flag_expected')} expected, saw {tuple(r.get('flag_seen') or ())}). "
          + restart)
