"""A record of every kernel's machine code in a built library, to compare builds.

  python scripts/sass_record.py --lib build/cp312-cp312-linux_x86_64/libllar_core.so \
      --out before.json
  python scripts/sass_record.py --lib ... --out after.json --compare before.json

Runs ``cuobjdump -sass`` and ``cuobjdump -res-usage`` (CUDA's; cuobjdump needs
nvdisasm on PATH; both come with the toolkit, or from PyPI as
nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm) and writes, per kernel and
architecture, a hash of its instructions with addresses, encodings and the
hash of anonymous namespaces removed (the last follows the source path, not
the code), its instruction count, registers, stack, shared and local bytes.
With --compare, prints every kernel whose instructions or resources differ
from the other record, and every kernel only one of them has; the exit status
is 1 when any does. A refactor that must leave device code alone ends with an
empty comparison, or with each difference explained (benchmarks/NOTES.md).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys

from absl import app, flags

LIB = flags.DEFINE_string("lib", None, "The shared library (or object file) to read.")
OUT = flags.DEFINE_string("out", None, "Write the record here (JSON).")
COMPARE = flags.DEFINE_string("compare", None, "A record to compare with.")
CUOBJDUMP = flags.DEFINE_string("cuobjdump", None, "cuobjdump to run (default: PATH's).")

_FUNCTION = re.compile(r"^\s*Function : (\S+)")
_ARCH = re.compile(r"^\s*arch = (sm_\d+a?)")
_ENCODING = re.compile(r"/\*[0-9a-f]{4}\*/|/\* 0x[0-9a-f]+ \*/")
_ANON = re.compile(r"_GLOBAL__N__[0-9a-f]+_\d+_\w+?_[0-9a-f]{8}")
_RES = re.compile(r"Function (\S+):\s*REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")


def normalise(name: str) -> str:
  """A kernel's mangled name without its anonymous namespace's hash."""
  return _ANON.sub("_GLOBAL__N_", name)


def sass_functions(text: str) -> dict[str, dict]:
  """{"arch/name": {"sha1", "instructions"}} of `cuobjdump -sass` output."""
  out: dict[str, dict] = {}
  arch, name, body = "?", None, []

  def close():
    if name is not None:
      lines = [ln.strip() for ln in body if ln.strip() and not ln.strip().startswith(".")]
      out[f"{arch}/{normalise(name)}"] = {
          "sha1": hashlib.sha1("\n".join(lines).encode()).hexdigest(),
          "instructions": sum(1 for ln in lines if ln.endswith(";"))}

  for raw in text.splitlines():
    m = _ARCH.match(raw)
    if m:
      close()
      arch, name, body = m.group(1), None, []
      continue
    m = _FUNCTION.match(raw)
    if m:
      close()
      name, body = m.group(1), []
      continue
    if name is not None:
      body.append(_ENCODING.sub("", raw))
  close()
  return out


def resources(text: str) -> dict[str, dict]:
  """{"name": {"regs", "stack", "shared", "local"}} of `cuobjdump -res-usage`."""
  out = {}
  for m in _RES.finditer(text.replace("\n", " ")):
    out[normalise(m.group(1))] = {"regs": int(m.group(2)), "stack": int(m.group(3)),
                                  "shared": int(m.group(4)), "local": int(m.group(5))}
  return out


def record(lib: str, cuobjdump: str) -> dict:
  """The record of `lib` (module docstring)."""
  def run(*args):
    p = subprocess.run([cuobjdump, *args, lib], capture_output=True, text=True, timeout=600)
    if p.returncode != 0 or "fatal" in p.stderr:
      raise RuntimeError(f"{cuobjdump} {' '.join(args)} {lib}: {p.stderr.strip()[-500:]}")
    return p.stdout

  functions = sass_functions(run("-sass"))
  res = resources(run("-res-usage"))
  for key, f in functions.items():
    f.update(res.get(key.split("/", 1)[1], {}))
  return {"library": lib, "functions": functions}


def compare(new: dict, old: dict) -> list[str]:
  """Lines naming each kernel that differs between two records."""
  lines = []
  a, b = old["functions"], new["functions"]
  for key in sorted(set(a) | set(b)):
    if key not in a or key not in b:
      lines.append(f"{'only in the new' if key in b else 'only in the old'}: {key}")
      continue
    if a[key] != b[key]:
      what = ", ".join(f"{k} {a[key].get(k)} -> {b[key].get(k)}"
                       for k in ("instructions", "regs", "stack", "shared", "local")
                       if a[key].get(k) != b[key].get(k)) or "instructions reordered"
      lines.append(f"differs: {key}: {what}")
  return lines


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not LIB.value:
    print("sass_record: --lib is required")
    return 1
  cuobjdump = CUOBJDUMP.value or shutil.which("cuobjdump")
  if not cuobjdump or not shutil.which("nvdisasm"):
    print("sass_record needs cuobjdump and nvdisasm on PATH (CUDA toolkit, or pip install "
          "nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
    return 1
  try:
    rec = record(LIB.value, cuobjdump)
  except (OSError, RuntimeError, subprocess.SubprocessError) as e:
    print(f"sass_record: {e}")
    return 1
  print(f"{len(rec['functions'])} kernels in {LIB.value}")
  if OUT.value:
    with open(OUT.value, "w") as f:
      json.dump(rec, f, indent=1, sort_keys=True)
  if COMPARE.value:
    with open(COMPARE.value) as f:
      lines = compare(rec, json.load(f))
    print("\n".join(lines) if lines else "no kernel differs")
    return 1 if lines else 0
  return 0


if __name__ == "__main__":
  sys.exit(app.run(main))
