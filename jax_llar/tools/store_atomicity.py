"""Store atomicity of 128-byte warp stores: the hardware property LL128 rests on.

  python -m jax_llar.tools.store_atomicity [--iterations 1000000] [--lines 2048]
      [--writer_device 0] [--reader_device 0] [--split] [--out result.json]

The LL128 line format (120 payload bytes and an 8-byte flag per 128-byte
line, stored by 8 lanes of a warp with one 16-byte vector store each)
assumes that such a line reaches the reader as one unit: a reader whose load
of the line sees the flag word (the last 8 bytes) sees the 120 payload bytes
of the same store. The CUDA memory model does not promise this. This tool
looks for counterexamples: writer warps store lines whose every 8-byte word
encodes (round, line, word), reader warps poll the lines with the same
whole-line loads and lane mapping as the protocol and count every load whose
flag is current while another word of the line is not (a torn line). The
timing is adversarial: writers and readers on many multiprocessors, random
delays before about half of the stores and polls (the rest back to back),
each line written by a different warp in consecutive rounds. A line is
written again only after its reader acknowledged the previous round, as the
protocol rewrites a slot only two epochs later.

Where it runs: with --writer_device equal to --reader_device (one GPU) every
access is local, so this tests the L2 path and NOT NVLink; the result says
so. With two devices that have peer access the writer stores into the
reader's memory over the peer path and the record names the link between
them (from nvidia-smi topo; NVLink is "NV<n>").

--split makes the writer store each line in two instructions, the flag's
half first: a check that the detector can fail, which must report torn
lines. Exit status: 0 when the run completed its checks and found no torn
line (with --split: found torn lines), 1 otherwise. Every device wait is
bounded (--timeout_ms), and the run stops after --max_seconds with the
rounds it checked until then. The result goes to --out (default:
OUT/<machine>-<yyyymmdd>-store-atomicity.json in the scratch folder),
written atomically; --out is checked before the run (a writable folder, not
a folder or special file itself).
"""

from __future__ import annotations

import os

from absl import flags

from jax_llar.tools import _cli, _native, report
from jax_llar.tools.atomicity import link_between, record

ITERATIONS = flags.DEFINE_integer("iterations", 1_000_000,
                                  "Rounds per line: each line is written and checked this "
                                  "many times.", lower_bound=1, upper_bound=2**32 - 2)
LINES = flags.DEFINE_integer("lines", 2048, "128-byte lines, a multiple of 4 (one warp "
                             "store covers 4 lines).", lower_bound=4, upper_bound=65536)
WRITER_DEVICE = flags.DEFINE_integer("writer_device", 0, "CUDA ordinal of the writers.",
                                     lower_bound=0, upper_bound=63)
READER_DEVICE = flags.DEFINE_integer("reader_device", 0, "CUDA ordinal of the readers (the "
                                     "lines live in its memory).", lower_bound=0,
                                     upper_bound=63)
WARPS_PER_BLOCK = flags.DEFINE_integer("warps_per_block", 4, "Warps per block of both "
                                       "kernels.", lower_bound=1, upper_bound=32)
MAX_DELAY_NS = flags.DEFINE_integer("max_delay_ns", 1000, "Bound of the random delays, "
                                    "nanoseconds (0: none).", lower_bound=0,
                                    upper_bound=1_000_000)
SPLIT = flags.DEFINE_bool("split", False, "Store each line in two instructions, the flag's "
                          "half first (the detector must then report torn lines).")
SPLIT_DELAY_NS = flags.DEFINE_integer("split_delay_ns", 2000, "--split: nanoseconds between "
                                      "the two halves.", lower_bound=0, upper_bound=1_000_000)
SEED = flags.DEFINE_integer("seed", 1, f"Seed of the random delays {_cli.SEED_RANGE}.",
                            **_cli.SEED_BOUNDS)
TIMEOUT_MS = flags.DEFINE_integer("timeout_ms", 5000, "Bound on every device wait, "
                                  "milliseconds.", lower_bound=1, upper_bound=600_000)
MAX_SECONDS = flags.DEFINE_float("max_seconds", 120.0, "Stop the run after this long (the "
                                 "result says how many rounds were checked).",
                                 lower_bound=0.001, upper_bound=3600.0)
OUT = flags.DEFINE_string("out", None, "The result file (JSON). Default: "
                          "<machine>-<yyyymmdd>-store-atomicity.json in the scratch folder "
                          "(jax_llar_results in TMPDIR).")


def main() -> int:
  settings = {"iterations": ITERATIONS.value, "lines": LINES.value,
              "writer_device": WRITER_DEVICE.value, "reader_device": READER_DEVICE.value,
              "warps_per_block": WARPS_PER_BLOCK.value, "max_delay_ns": MAX_DELAY_NS.value,
              "split": SPLIT.value, "split_delay_ns": SPLIT_DELAY_NS.value,
              "seed": SEED.value, "timeout_ms": TIMEOUT_MS.value,
              "max_seconds": MAX_SECONDS.value}
  if LINES.value % 4:
    print("jax_llar.tools.store_atomicity: --lines must be a multiple of 4")
    return 1
  if OUT.value is not None:
    path = _cli.writable_file(OUT.value, "out")
  else:
    folder = _cli.writable_folder(report.default_out_dir(), "out")
    path = None
  try:
    mod = _native.require("python -m jax_llar.tools.store_atomicity")
  except RuntimeError as e:
    print(e)
    return 1
  try:
    r = dict(mod.store_atomicity(
        settings["writer_device"], settings["reader_device"], settings["iterations"],
        lines=settings["lines"], warps_per_block=settings["warps_per_block"],
        max_delay_ns=settings["max_delay_ns"], split=settings["split"],
        split_delay_ns=settings["split_delay_ns"], seed=settings["seed"],
        timeout_ms=float(settings["timeout_ms"]), max_seconds=settings["max_seconds"]))
  except (ValueError, RuntimeError) as e:
    print(f"jax_llar.tools.store_atomicity: {type(e).__name__}: {e}")
    return 1
  link = None if r["same_device"] else link_between(r["writer_pci_bus_id"],
                                                    r["reader_pci_bus_id"])
  out = record(r, settings, link) | {"env": report.environment()}
  print(out["note"])
  print(f"{r['writer_name']} (device {settings['writer_device']}) -> {r['reader_name']} "
        f"(device {settings['reader_device']}), link: {out['link']}")
  print(f"rounds checked: {r['rounds_completed']} of {settings['iterations']} x "
        f"{settings['lines']} lines = {r['line_rounds']} line stores, "
        f"{r['polls']} warp loads, {r['seconds']:.1f} s")
  print(f"torn lines: {r['torn_lines']} (torn loads {r['torn_loads']}, bad words "
        f"{r['bad_words']})" + (" [--split: the writer tears lines on purpose]"
                                if settings["split"] else ""))
  if r["first_torn"]:
    t = r["first_torn"]
    print(f"first torn load: line {t['line']}, round {t['round']}, rounds seen per word: "
          f"{[w >> 32 for w in t['words']]}")
  for key in ("cuda_error", "timed_out", "deadline_exceeded", "stopped_by_host"):
    if r.get(key):
      print(f"{key}: {r[key]}" + (f" ({r['timeout_side']} group {r['timeout_group']} "
                                  f"round {r['timeout_round']})" if key == "timed_out" else ""))
  print(f"verdict: {out['verdict']}")
  if path is None:
    path = os.path.join(folder, report.stem("store-atomicity") + ".json")
  report.write_json(path, out)
  print(f"saved {path}")
  return 0 if out["passed"] else 1


if __name__ == "__main__":
  _cli.run(main)
