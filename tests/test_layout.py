"""The layout rules of the repository (issue 8), checked statically.

(a) The library never imports the tools: no module of ``jax_llar/*.py``
    imports ``jax_llar.tools``, and a process that imports jax_llar, lowers a
    psum and asks for ``status()`` has no ``jax_llar.tools`` module loaded.
(b) ``jax_llar/algorithms.py`` agrees with the C++ source: the ids of the
    ``Algorithm`` enum (``ffi/include/llar/args.h``), the algorithm table
    ``kAlgorithms`` (``ffi/src/kernels/kernels.h``: name, Algorithm and largest
    payload per rank, indexed by id) and ``kMaxRanks``. (The GPU suite
    compares with the loaded module's ``ALGORITHMS``, ``MAX_BYTES`` and
    ``MAX_RANKS``; ``jax_llar._ext`` refuses an extension that differs.)
(c) No comment or docstring in ``jax_llar/`` or ``ffi/`` quotes a
    measurement (a number, integer or decimal, or a range, followed by a time
    unit (us, ns, ms, s, spelled out too) or a bandwidth (GB/s); a ratio such
    as "4.2x", "2.2×" or "3X faster"; a percentage such as "20% faster"):
    comments state the rule, ``benchmarks/NOTES.md`` keeps the figures. Rules
    and settings that the code applies (a timeout, a cut-off) are listed in
    ``ALLOWED`` with the reason.
"""

from __future__ import annotations

import ast
import io
import os
import pathlib
import re
import subprocess
import sys
import textwrap
import tokenize

import pytest

from jax_llar import algorithms

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "jax_llar"
FFI = ROOT / "ffi"
C_SUFFIXES = {".h", ".hpp", ".c", ".cc", ".cpp", ".cu", ".cuh"}


# --- (a) the library never imports the tools ----------------------------------------


def _tools_imports(path: pathlib.Path) -> list[str]:
  """Imports of jax_llar.tools in one library module, as 'line: what'."""
  tree = ast.parse(path.read_text(), filename=str(path))
  found = []

  def is_tools(name: str) -> bool:
    return name == "jax_llar.tools" or name.startswith("jax_llar.tools.")

  for node in ast.walk(tree):
    names = []
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      if node.level:  # relative to the package jax_llar
        base = "jax_llar" + ("." + node.module if node.module else "")
      else:
        base = node.module or ""
      names = [base] + [f"{base}.{a.name}" for a in node.names]
    elif isinstance(node, ast.Call):
      fn = node.func
      fn_name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
      if fn_name in ("import_module", "__import__") and node.args and isinstance(
          node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
        names = [node.args[0].value]
    hits = [n for n in names if is_tools(n)]
    if hits:
      found.append(f"{node.lineno}: {hits[0]}")
  return found


def test_library_modules_do_not_import_tools():
  modules = sorted(PACKAGE.glob("*.py"))
  assert len(modules) >= 10, modules
  bad = {p.name: _tools_imports(p) for p in modules}
  assert {k: v for k, v in bad.items() if v} == {}


def test_tools_import_scan_finds_imports(tmp_path):
  """The scan itself: every spelling of an import of the tools is found."""
  src = tmp_path / "m.py"
  src.write_text(textwrap.dedent("""\
      import jax_llar.tools
      import jax_llar.tools.bench as b
      from jax_llar.tools import traces
      from jax_llar import tools
      from . import tools
      from .tools.copy import copy
      importlib.import_module("jax_llar.tools._native")
      import jax_llar.testing
      from jax_llar import testing
      """))
  assert [f.split(":")[0] for f in _tools_imports(src)] == [
      "1", "2", "3", "4", "5", "6", "7"]


def test_importing_and_using_the_library_loads_no_tool():
  program = textwrap.dedent("""\
      import sys
      import jax, numpy as np
      from jax.sharding import Mesh, PartitionSpec as P
      import jax_llar
      mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
      f = jax.jit(jax.shard_map(lambda v: jax_llar.psum(v, "x"), mesh=mesh,
                                in_specs=P("x"), out_specs=P()))
      f(np.ones((2, 4), np.float32))
      jax.jit(jax.shard_map(lambda v: jax_llar.psum(v, "x"), mesh=mesh,
                            in_specs=P("x"), out_specs=P())).trace(
          np.ones((2, 4), np.float32)).lower(lowering_platforms=("cuda",))
      with jax_llar.swap_psum():
        pass
      jax_llar.status(); jax_llar.error_reports(); jax_llar.dispatch_log()
      assert len(jax_llar.dispatch_log()) == 2, jax_llar.dispatch_log()
      loaded = sorted(m for m in sys.modules
                      if m == "jax_llar.tools" or m.startswith("jax_llar.tools."))
      assert not loaded, loaded
      print("ok")
      """)
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_force_host_platform_device_count=2",
             PYTHONPATH=os.pathsep.join(
                 [str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
  r = subprocess.run([sys.executable, "-c", program], env=env, cwd=ROOT,
                     capture_output=True, text=True, timeout=300, check=False)
  assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


# --- (b) algorithms.py against the C++ source -------------------------------------------


def _c_sources() -> list[pathlib.Path]:
  return sorted(p for p in FFI.rglob("*") if p.suffix in C_SUFFIXES)


def _strip_c_comments(text: str) -> str:
  return "".join(code for code, _ in _c_split(text))


def _constexpr_expressions() -> dict[str, str]:
  """name -> expression of every ``constexpr ... kName = expr;``."""
  out = {}
  pattern = re.compile(
      r"constexpr\s+[\w:<>\s]+?\s(k\w+)\s*=\s*([^;{}]+);", re.S)
  for path in _c_sources():
    for name, expr in pattern.findall(_strip_c_comments(path.read_text())):
      out.setdefault(name, " ".join(expr.split()))
  return out


def _evaluate(name: str, exprs: dict[str, str]) -> int:
  """Integer value of the constant `name`, following other constants."""
  expr = exprs[name]
  expr = re.sub(r"static_cast<[^<>]+>", "", expr)
  expr = re.sub(r"\b(?:std::)?(?:size_t|u?int(?:8|16|32|64)_t|int|unsigned)\s*\(",
                "(", expr)
  expr = re.sub(r"\b(\d+)(?:[uU]|[lL]{1,2}|[uU][lL]{1,2})\b", r"\1", expr)
  tree = ast.parse(expr, mode="eval")

  def ev(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
      return node.value
    if isinstance(node, ast.Name):
      return _evaluate(node.id, exprs)
    if isinstance(node, ast.BinOp):
      ops = {ast.Mult: lambda a, b: a * b, ast.Add: lambda a, b: a + b,
             ast.Sub: lambda a, b: a - b, ast.FloorDiv: lambda a, b: a // b,
             ast.Div: lambda a, b: a // b, ast.LShift: lambda a, b: a << b}
      return ops[type(node.op)](ev(node.left), ev(node.right))
    raise ValueError(f"cannot evaluate {name} = {exprs[name]}")

  return ev(tree.body)


def _upper_snake(enumerator: str) -> str:
  """kOneShotLL -> ONE_SHOT_LL; kNcclLLA2AOneShot -> NCCL_LLA2A_ONE_SHOT (an
  acronym may hold digits followed by capitals)."""
  words = re.findall(r"[A-Z]+[0-9]+[A-Z]+(?![a-z])|[A-Z]+[0-9]*(?![a-z])|[A-Z][a-z0-9]*",
                     enumerator[1:])
  return "_".join(w.upper() for w in words)


def _algorithm_enum() -> dict[str, int]:
  pattern = re.compile(r"enum\s+class\s+Algorithm\b[^{]*\{([^}]*)\}", re.S)
  found = {}
  for path in _c_sources():
    for body in pattern.findall(_strip_c_comments(path.read_text())):
      for item in body.split(","):
        if item.strip():
          name, value = (s.strip() for s in item.split("="))
          found[_upper_snake(name)] = int(value, 0)
  return found


def _algorithm_table() -> list[tuple[str | None, str, str | None]]:
  """The rows of ``kAlgorithms[]``: (name or None, max_bytes expression,
  Algorithm enumerator or None), in order (the row index is the FFI id).
  Row 0 is ``AlgorithmEntry{}``; the others are built by field name,
  ``AlgorithmRow<Algorithm::kX>("name").MaxBytes(expr)...``."""
  pattern = re.compile(r"AlgorithmEntry\s+kAlgorithms\s*\[\s*\]\s*=\s*\{(.*?)\};",
                       re.S)
  row = re.compile(r"AlgorithmEntry\s*\{\s*\}"
                   r"|AlgorithmRow\s*<\s*Algorithm::(k\w+)\s*>\s*\(\s*\"(\w+)\"\s*\)"
                   r"((?:\s*\.\s*\w+\s*\([^()]*\))*)")
  max_bytes = re.compile(r"\.\s*MaxBytes\s*\(\s*([^()]+?)\s*\)")
  for path in _c_sources():
    m = pattern.search(_strip_c_comments(path.read_text()))
    if m:
      rows = []
      for enumerator, name, setters in row.findall(m.group(1)):
        if not name:
          rows.append((None, "0", None))
          continue
        found = max_bytes.search(setters)
        rows.append((name, found.group(1) if found else "0", enumerator))
      return rows
  pytest.fail("no `AlgorithmEntry kAlgorithms[] = {...};` under ffi/: the "
              "algorithm table moved; update tests/test_layout.py")


def test_algorithm_ids_equal_the_cpp_enum():
  enum = _algorithm_enum()
  assert enum, "enum class Algorithm not found under ffi/"
  assert enum == {a.name: int(a) for a in algorithms.Algorithm}


def test_algorithm_table_equals_algorithms_py():
  exprs = _constexpr_expressions()
  rows = _algorithm_table()
  assert rows and rows[0] == (None, "0", None), rows  # id 0: no algorithm
  ids = {name: i for i, (name, _, _) in enumerate(rows) if name}
  # Each row names the Algorithm it describes; the enum is the Python one's.
  assert {name: _upper_snake(enumerator) for name, _, enumerator in rows if name} == {
      a.short_name: a.name for a in algorithms.Algorithm}
  max_bytes = {name: _evaluate(expr, exprs) if expr in exprs else int(expr)
               for name, expr, _ in rows if name}
  assert ids == {a.short_name: int(a) for a in algorithms.Algorithm}
  assert max_bytes == {a.short_name: n for a, n in algorithms.MAX_BYTES.items()}


def test_max_ranks_equals_cpp():
  exprs = _constexpr_expressions()
  assert _evaluate("kMaxRanks", exprs) == algorithms.MAX_RANKS
  # The one-shot limit, from the scratch geometry of args.h.
  assert (_evaluate("kOneShotMaxBytes", exprs)
          == algorithms.MAX_BYTES[algorithms.Algorithm.ONE_SHOT_LL])


def test_signed_algorithms_equal_cpp():
  """algorithms.SIGNED lists exactly the algorithms args.h's CarriesSignature
  returns true for, and the signature's width is args.h's kSignatureBits."""
  args_h = _strip_c_comments((FFI / "include" / "llar" / "args.h").read_text())
  body = re.search(r"constexpr bool CarriesSignature\(Algorithm algorithm\)\s*\{(.*?)\n\}",
                   args_h, re.S)
  assert body, "CarriesSignature not found in args.h"
  signed = re.findall(r"case Algorithm::(k\w+):\s*return true;", body.group(1))
  # Any other algorithm (a new one included) is unsigned.
  assert re.search(r"default:\s*return false;", body.group(1)), body.group(1)
  assert {_upper_snake(n) for n in signed} == {a.name for a in algorithms.SIGNED}
  from jax_llar import signature  # pylint: disable=g-import-not-at-top
  assert _evaluate("kSignatureBits", _constexpr_expressions()) == signature.SIGNATURE_BITS


def test_cpp_parsing_helpers():
  assert _upper_snake("kOneShotLL") == "ONE_SHOT_LL"
  assert _upper_snake("kTwoShotLL128Atomic") == "TWO_SHOT_LL128_ATOMIC"
  assert _upper_snake("kNcclLLA2AOneShot") == "NCCL_LLA2A_ONE_SHOT"
  assert _upper_snake("kOneShotLL128") == "ONE_SHOT_LL128"
  exprs = {"kA": "64", "kB": "std::size_t(kA) * 512u * static_cast<int>(8)",
           "kC": "(kB + 2) / 2"}
  assert _evaluate("kB", exprs) == 64 * 512 * 8
  assert _evaluate("kC", exprs) == (64 * 512 * 8 + 2) // 2


# --- (c) no measurement in comments or docstrings ----------------------------------------

# A number, or a range of two ("2.06-2.82", "1.09 to 1.73"): integer or
# decimal, with digit groups ("5,000", "5'000"). Not part of a word, a
# version or a hex literal.
_NUM = r"(?:\d+(?:[,'_]\d{3})*(?:\.\d+)?|\.\d+)"
_RANGE = rf"(?<![\w.]){_NUM}(?:\s*(?:-|–|—|to)\s*{_NUM})?"
# Durations and bandwidths, abbreviated or spelled out.
_UNIT = (r"(?:us|µs|μs|ns|ms|s|secs?|seconds?|[unmµμ]secs?|"
         r"microseconds?|nanoseconds?|milliseconds?|"
         r"[KMGT]i?(?:B|b|bit)/s(?:ec)?|[KMGT]i?Bps)(?![\w/])")
_COMPARED = r"(?:faster|slower|lower|higher|less|more|better|worse|speed-?up)\b"
MEASUREMENT = re.compile(
    rf"{_RANGE}\s*{_UNIT}"  # "0.75 us", "took 12ms", "1.5 microseconds", "150 GB/s"
    rf"|{_RANGE}(?:[xX×](?!\w)|\s+[xX×]\s*(?={_COMPARED}))"  # "4.2x", "3X", "2.2×", "2 x faster"
    rf"|{_RANGE}\s*%\s*{_COMPARED}")  # "20% faster"

# Comments that quote a number with a unit as a rule or setting of the code,
# not as a measurement: (file, phrase of the comment line, why). An entry
# exempts the hits on lines of that file that contain the phrase; an entry
# that exempts nothing fails test_measurement_allowlist_entries_are_used.
ALLOWED = [
    ("ffi/include/llar/wait.cuh", "wait for that mark (at most 1 s)",
     "the bound the code puts on the wait for the published timeout report "
     "(a rule of the wait, not a measured time)"),
    ("ffi/tools/sol.h", "timed-out (5 s) wait",
     "the speed-of-light probe's timeout, kSolTimeoutNs in sol.cu (a setting)"),
    ("jax_llar/tools/traces.py", "(periods under 50 us",
     "the cut-off `timeline` applies to the periods it takes the median of "
     "(`b - a < 50`; a rule of the statistic)"),
    ("jax_llar/tools/tune/cli.py", "within 5% of the best single choice; 3x",
     "issue 11's JAX-level criteria that --verify applies (tune_plan.verdicts' "
     "slack and speedup defaults; rules, not measurements)"),
    ("jax_llar/agreement.py", "of 60 s and twice the kernels' bounded wait",
     "the bound `bootstrap_timeout_ms` puts on every read of the key-value store "
     "(max(60_000, 2 * timeout_ms); a setting)"),
]


def _pp_number_end(text: str, i: int) -> int:
  """End of the C/C++ preprocessing number that starts at `i` (a digit, or a
  '.' before a digit): digits, letters, '.', exponent signs and the C++14
  digit separator ' (as in 5'000'000'000ull)."""
  m = re.compile(r"\.?\d(?:[eEpP][+-]|'(?=\w)|[\w.])*").match(text, i)
  return m.end()


def _c_split(text: str):
  """Yields (code, comment) pieces of C/C++/CUDA source: string and char
  literals and numbers (digit separators included) stay in code, // and
  /* */ comments go to comment."""
  i, n = 0, len(text)
  code = []
  while i < n:
    c = text[i]
    starts_number = (c.isdigit() or (c == "." and text[i + 1:i + 2].isdigit()))
    if starts_number and not (i and (text[i - 1].isalnum() or text[i - 1] == "_")):
      j = _pp_number_end(text, i)
      code.append(text[i:j])
      i = j
    elif text.startswith("//", i):
      j = text.find("\n", i)
      j = n if j < 0 else j
      yield "".join(code), text[i:j]
      code = []
      i = j
    elif text.startswith("/*", i):
      j = text.find("*/", i + 2)
      j = n if j < 0 else j + 2
      yield "".join(code), text[i:j]
      code = []
      i = j
    elif c in "\"'":
      j = i + 1
      while j < n and text[j] != c:
        j += 2 if text[j] == "\\" else 1
      code.append(text[i:j + 1])
      i = j + 1
    else:
      code.append(c)
      i += 1
  yield "".join(code), ""


def _python_comments_and_docstrings(path: pathlib.Path) -> list[tuple[int, str]]:
  text = path.read_text()
  out = []
  for tok in tokenize.generate_tokens(io.StringIO(text).readline):
    if tok.type == tokenize.COMMENT:
      out.append((tok.start[0], tok.string))
  for node in ast.walk(ast.parse(text)):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                         ast.AsyncFunctionDef)):
      doc = ast.get_docstring(node, clean=False)
      if doc is not None:
        out.append((node.body[0].lineno, doc))
  return out


def _c_comments(path: pathlib.Path) -> list[tuple[int, str]]:
  text = path.read_text()
  out, offset = [], 0
  for code, comment in _c_split(text):
    offset += len(code)
    if comment:
      out.append((text.count("\n", 0, offset) + 1, comment))
      offset += len(comment)
  return out


def _cmake_comments(path: pathlib.Path) -> list[tuple[int, str]]:
  return [(i, line[line.index("#"):])
          for i, line in enumerate(path.read_text().splitlines(), 1)
          if "#" in line]


def _comment_pieces(path: pathlib.Path) -> list[tuple[int, str]]:
  if path.suffix == ".py":
    return _python_comments_and_docstrings(path)
  if path.suffix in C_SUFFIXES:
    return _c_comments(path)
  return _cmake_comments(path)


def _scanned_files(roots=(PACKAGE, FFI)) -> list[pathlib.Path]:
  files = []
  for root in roots:
    files += sorted(p for p in root.rglob("*")
                    if "__pycache__" not in p.parts and p.is_file() and (
                        p.suffix in C_SUFFIXES or p.suffix in (".py", ".cmake")
                        or p.name == "CMakeLists.txt"))
  return files


def measurement_hits(files, allowed=()):
  """(relative path, line, match, comment line) for every measurement in a
  comment or docstring of `files`, less those `allowed` exempts, and the set
  of indices of the `allowed` entries that exempted something."""
  hits, used = [], set()
  for path in files:
    rel = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name
    for line, piece in _comment_pieces(path):
      for k, text_line in enumerate(piece.splitlines()):
        for m in MEASUREMENT.finditer(text_line):
          exempt = [e for e, (f, phrase, _) in enumerate(allowed)
                    if f == rel and phrase in text_line]
          if exempt:
            used.update(exempt)
          else:
            hits.append((rel, line + k, m.group(0), text_line.strip()))
  return hits, used


def measurements_in_comments() -> dict[str, list[str]]:
  """'path: [line: text, ...]' for every comment or docstring of jax_llar/
  and ffi/ that quotes a measurement (the ALLOWED rules excepted)."""
  found = {}
  for rel, line, match, text_line in measurement_hits(_scanned_files(), ALLOWED)[0]:
    found.setdefault(rel, []).append(f"{line}: {match!r} in {text_line!r}")
  return found


def test_measurement_pattern():
  for quoted in ["0.75 us", "2.06-2.82 us", "about 0.1 us slower", "136.0 ns",
                 "1.5ms", "2.2-4.2x faster", "4.2x", "6x", "0.50 us",
                 "1.09 to 1.73 us", "2-2.5 us", "7 - 8.25 µs",
                 # integers are measurements too
                 "costs 3 us per call", "150 ns faster", "took 12ms",
                 "gaps up to 5 us", "default 30000 ms", "5'000 ns", "1,200 ns",
                 # spelled units, seconds, bandwidths
                 "1.5 microseconds", "3 nanoseconds", "2 milliseconds",
                 "20 usec", "took 2 s", "4.5 seconds", "150 GB/s", "40.5 GiB/s",
                 # ratios in every spelling, percentages
                 "2.2× faster", "3X faster", "1.5 x slower", "2 × faster",
                 "20% faster", "5 % slower", "10-15% lower", "3% higher"]:
    assert MEASUREMENT.search(quoted), quoted
  for rule in ["16-byte LL lines", "0x7FC00001", "2 x H200", "timeout_ns",
               "%globaltimer, ns", "64 lines per block", "x86_64", "sm_90",
               "1e6", "a 48-byte block", "bounded by JAX_LLAR_TIMEOUT_MS",
               "version 2.28.9", "jax 0.11.2", "H200s", "2x2 mesh",
               "8 steps", "2 × 8 ranks", "20% of the ranks", "x * 0.25",
               "float32 (4 bytes)", "arXiv 2607.16100", "100%"]:
    assert not MEASUREMENT.search(rule), rule


def test_comment_scanners(tmp_path):
  c = tmp_path / "a.cu"
  c.write_text('int a = 1;  // took 0.75 us\nconst char* s = "// 9 us";\n'
               '/* 2.2-4.2x\n faster */ int b;\n'
               "uint64_t t = 5'000'000'000ull;  // costs 3 us\n"
               "char q = '/'; auto w = L'x'; float f = 1.5e+3f;  // 150 ns faster\n"
               "int h = 0x1'00; double d = .5e-2;  // 2.2× faster\n")
  assert [(n, t) for n, t in _c_comments(c)] == [
      (1, "// took 0.75 us"), (3, "/* 2.2-4.2x\n faster */"),
      (5, "// costs 3 us"), (6, "// 150 ns faster"), (7, "// 2.2× faster")]
  p = tmp_path / "a.py"
  p.write_text('"""Module: 3 ns."""\nx = "5 us"  # 4.2x\n'
               'def f():\n  """Doc 1.0 ms."""\n')
  assert sorted(t for _, t in _python_comments_and_docstrings(p)) == [
      "# 4.2x", "Doc 1.0 ms.", "Module: 3 ns."]


def test_digit_separator_does_not_hide_comments():
  """ffi/tools/sol.cu's 5'000'000'000ull: the comments after it are read."""
  text = "constexpr uint64_t kT = 5'000'000'000ull;  // took 12ms\nint x;  // 3X faster\n"
  assert [c for _, c in _c_split(text) if c] == ["// took 12ms", "// 3X faster"]


def test_allowlist_exempts_only_its_file_and_phrase(tmp_path):
  (tmp_path / "a.cuh").write_text("// waits at most 1 s for the mark\n"
                                  "// the copy took 1 s\n")
  (tmp_path / "b.cuh").write_text("// waits at most 1 s for the mark\n")
  allowed = [("a.cuh", "waits at most 1 s", "a rule"),
             ("a.cuh", "never matches", "stale")]
  hits, used = measurement_hits(sorted(tmp_path.iterdir()), allowed)
  assert [(f, n) for f, n, _, _ in hits] == [("a.cuh", 2), ("b.cuh", 1)]
  assert used == {0}


def test_measurement_allowlist_entries_are_used():
  """Every ALLOWED entry still exempts a comment (else remove or update it)."""
  _, used = measurement_hits(_scanned_files(), ALLOWED)
  assert [e[:2] for i, e in enumerate(ALLOWED) if i not in used] == []


def test_no_measurement_in_library_comments():
  found = measurements_in_comments()
  report = "\n".join(f"{path}:\n  " + "\n  ".join(hits)
                     for path, hits in found.items())
  assert not found, ("comments or docstrings quote measurements (state the "
                     "rule; figures go to benchmarks/NOTES.md; a rule or "
                     "setting goes to ALLOWED with the reason):\n" + report)


def test_package_docstring_quotes_no_speed():
  """Issue 15, item 7: ``jax_llar.__doc__`` makes no speed claim (the
  README's performance section holds the figures)."""
  import jax_llar  # pylint: disable=g-import-not-at-top
  doc = jax_llar.__doc__
  assert "psum" in doc and "README" in doc
  assert not MEASUREMENT.search(doc)
  assert not re.search(r"\bfaster\b|\bspeed-?up\b|\d+(\.\d+)?x\b", doc)


def test_package_version_is_stated_once_alike():
  """pyproject.toml's version is the package's __version__ (a newcomer found
  0.1.0 against 0.2.0)."""
  import tomllib
  with open(ROOT / "pyproject.toml", "rb") as f:
    version = tomllib.load(f)["project"]["version"]
  assert f'__version__ = "{version}"' in (PACKAGE / "__init__.py").read_text()


def test_no_source_points_at_an_entry_of_the_notes():
  """Comments state rules and contracts; the history and the measurements
  behind them are benchmarks/NOTES.md's, found there by topic, not pointed
  at by entry number from the code."""
  pattern = re.compile(r"NOTES(\.md)?,?\s+entr(y|ies)\s+\d|entr(y|ies)\s+\d+[^\n]*NOTES")
  found = []
  for root in ("jax_llar", "ffi"):
    for path in sorted((ROOT / root).rglob("*")):
      if path.suffix not in (".py", ".h", ".cc", ".cu", ".cuh") or "__pycache__" in path.parts:
        continue
      text = path.read_text()
      # A comment wrapped over two lines: join them before matching.
      joined = re.sub(r"\n\s*(#|//)\s*", " ", text)
      found += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in pattern.finditer(joined)]
  assert not found, found


def test_every_algorithm_has_its_kernel_files_its_rows_and_its_tests():
  """docs/design.md's steps for adding an algorithm, walked over the table:
  every Algorithm has its kernel template and instantiation
  (ffi/src/kernels/<name>.cuh and .cu), both builds list the .cu, the
  extension's table names it (kernels.h; compared field by field with
  algorithms.py elsewhere in this file), and both GPU suites' tables and the
  sanitize matrix run it (the loopback ones unless the harness cannot
  simulate it)."""
  from jax_llar.algorithms import Algorithm  # pylint: disable=g-import-not-at-top
  from jax_llar.tools.loopback import harness as loopback_harness  # pylint: disable=g-import-not-at-top
  from jax_llar.tools.sanitize import harness as sanitize_harness  # pylint: disable=g-import-not-at-top
  cmake = (ROOT / "ffi" / "CMakeLists.txt").read_text()
  bazel = (ROOT / "BUILD.bazel").read_text()
  kernels_h = (ROOT / "ffi" / "src" / "kernels" / "kernels.h").read_text()
  gpu = (ROOT / "tests" / "gpu" / "test_algorithms.py").read_text()
  gpu1 = (ROOT / "tests" / "gpu1" / "test_algorithms_loopback.py").read_text()
  sanitized = {a.split("=", 1)[1] for u in sanitize_harness.FULL for a in u.args
               if a.startswith("--algorithm=")}
  missing = []
  for a in Algorithm:
    name = a.short_name
    for ext in (".cuh", ".cu"):
      if not (ROOT / "ffi" / "src" / "kernels" / (name + ext)).is_file():
        missing.append(f"{name}: ffi/src/kernels/{name}{ext}")
    if f"src/kernels/{name}.cu" not in cmake:
      missing.append(f"{name}: ffi/CMakeLists.txt")
    if f"ffi/src/kernels/{name}.cu" not in bazel:
      missing.append(f"{name}: BUILD.bazel")
    if f'"{name}"' not in kernels_h:
      missing.append(f"{name}: kernels.h's kAlgorithms")
    if f"Algorithm.{a.name}" not in gpu:
      missing.append(f"{name}: tests/gpu/test_algorithms.py's table")
    if name not in loopback_harness.NOT_SIMULATED:
      if f'"{name}"' not in gpu1:
        missing.append(f"{name}: tests/gpu1/test_algorithms_loopback.py's table")
      if name not in sanitized:
        missing.append(f"{name}: the sanitize matrix")
  assert not missing, missing
