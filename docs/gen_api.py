#!/usr/bin/env python3
"""Writes docs/api.md, the reference of jax_llar's public names, from the source.

  python docs/gen_api.py              write docs/api.md
  python docs/gen_api.py --out DIR    write DIR/api.md instead
  python docs/gen_api.py --check      exit 1 when docs/api.md differs from what
                                      this script writes

Standard library only. The Python reference is read from the source with
`ast`: docstrings, signatures, dataclass fields, enum members, and each
module-level constant with the comment block above it. Nothing of jax_llar is
imported, so the page is the same whichever jax is installed. The reference
of the command-line tools is each tool's own ``--help`` (``python -m
jax_llar.tools.<name> --help``, run in subprocesses with a fixed environment),
with the machine's paths taken out.

Public names: every name of ``jax_llar.__all__``, and every name that does
not start with ``_`` defined (def, class or assignment) at the top level of
the modules of PUBLIC_MODULES. The modules of INTERNAL_MODULES are documented
the same way and marked internal. tests/test_docs.py checks that the committed
page equals this script's output and that every public name has an entry.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Modules documented as the public API, in page order (after jax_llar itself).
PUBLIC_MODULES = (
    "jax_llar.config",
    "jax_llar.algorithms",
    "jax_llar.fused",
    "jax_llar.testing",
    "jax_llar.tuning",
    "jax_llar.table_lookup",
    "jax_llar.signature",
    "jax_llar.distributed",
    "jax_llar.agreement",
    "jax_llar.tools.launch",
)

# Modules the library is built from; documented for completeness, their names
# may change without notice (use the names jax_llar exports).
INTERNAL_MODULES = (
    "jax_llar.psum",
    "jax_llar.swap",
    "jax_llar.log",
    "jax_llar.status",
    "jax_llar.explain",
    "jax_llar.policy",
    "jax_llar.lowering",
    "jax_llar.dispatch",
    "jax_llar.inputs",
    "jax_llar.reports",
    "jax_llar.jsonfile",
    "jax_llar.native_bounds",
    "jax_llar.comm",
)

# The command-line tools (python -m jax_llar.tools.<name>).
TOOLS = ("bench", "tune", "soak", "loopback", "sanitize", "store_atomicity", "sol",
         "graphcheck", "launch")

# The order of jax_llar's names on the page (its docstring's order); names of
# __all__ not listed here follow in __all__'s order.
PACKAGE_ORDER = ("psum", "psum_add_rms_norm", "swap_psum", "install", "uninstall",
                 "installed", "dispatch_log", "clear_dispatch_log", "Decision", "status",
                 "error_reports", "explain", "config", "Algorithm")

# Dunder methods shown even without a docstring (they carry the signature).
SHOWN_DUNDERS = ("__init__", "__call__", "__enter__", "__exit__")

# Longest constant value shown in full, in lines.
MAX_VALUE_LINES = 15

# Wrap a signature one parameter per line above this many characters.
MAX_SIGNATURE_CHARS = 88


def module_path(name: str) -> pathlib.Path:
  """The source file of module `name` (a package's __init__.py)."""
  path = ROOT.joinpath(*name.split("."))
  if path.with_suffix(".py").is_file():  # jax_llar/tuning.py beside jax_llar/tuning/
    return path.with_suffix(".py")
  return path / "__init__.py"


def slug(heading: str) -> str:
  """GitHub's anchor for a Markdown heading (without duplicate suffixes)."""
  text = heading.strip().lower().replace("`", "")
  text = re.sub(r"[^\w\- ]", "", text)
  return text.replace(" ", "-")


# --- reading the source ---------------------------------------------------------


class Source:
  """One module's source: its tree and lines."""

  def __init__(self, name: str):
    self.name = name
    self.path = module_path(name)
    self.text = self.path.read_text()
    self.lines = self.text.splitlines()
    self.tree = ast.parse(self.text, filename=str(self.path))

  @property
  def docstring(self) -> str:
    return ast.get_docstring(self.tree) or ""

  def definitions(self) -> list[ast.stmt]:
    """Top-level defs, classes and assignments of public names, in source order."""
    out = []
    for node in self.tree.body:
      name = defined_name(node)
      if name is not None and not name.startswith("_"):
        out.append(node)
    return out

  def find(self, name: str) -> ast.stmt | None:
    for node in self.tree.body:
      if defined_name(node) == name:
        return node
    return None

  def comment_above(self, node: ast.stmt) -> str:
    """The block of ``#`` comment lines right above `node`, without the ``#``."""
    i = node.lineno - 2  # the line above, 0-based
    block = []
    while i >= 0 and self.lines[i].lstrip().startswith("#"):
      block.append(self.lines[i].lstrip()[1:].removeprefix(" "))
      i -= 1
    return "\n".join(reversed(block))

  def comment_of(self, node: ast.stmt) -> str:
    """What the source says of an assignment: the comment block above it, or
    that of the group of assignments it ends (no blank line between them),
    and a comment at the end of its own line."""
    above = self.comment_above(node)
    if not above:
      body = self.tree.body
      i = body.index(node)
      while i > 0 and body[i - 1].end_lineno == body[i].lineno - 1 and not above:
        i -= 1
        above = self.comment_above(body[i])
    tail = self.lines[node.end_lineno - 1][node.end_col_offset:].strip()
    if tail.startswith("#"):
      tail = tail[1:].strip()
      above = f"{above}\n{tail}" if above else tail
    return above

  def segment(self, node: ast.AST) -> str:
    return ast.get_source_segment(self.text, node) or ast.unparse(node)


def defined_name(node: ast.stmt) -> str | None:
  """The name a top-level statement defines (one name), or None."""
  if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
    return node.name
  if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(
      node.targets[0], ast.Name):
    return node.targets[0].id
  if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
    return node.target.id
  return None


# --- rendering ---------------------------------------------------------------------


def _arg(a: ast.arg) -> str:
  return a.arg + (f": {ast.unparse(a.annotation)}" if a.annotation is not None else "")


def _with_default(text: str, annotated: bool, default: ast.expr | None) -> str:
  if default is None:
    return text
  return text + (" = " if annotated else "=") + ast.unparse(default)


def parameters(args: ast.arguments, *, method: bool) -> list[str]:
  """The parameters of a signature, as written; without self/cls for a method."""
  out: list[str] = []
  positional = args.posonlyargs + args.args
  defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
  for i, (a, d) in enumerate(zip(positional, defaults)):
    if not (method and i == 0):
      out.append(_with_default(_arg(a), a.annotation is not None, d))
    if args.posonlyargs and i == len(args.posonlyargs) - 1:
      out.append("/")
  if args.vararg is not None:
    out.append("*" + _arg(args.vararg))
  elif args.kwonlyargs:
    out.append("*")
  for a, d in zip(args.kwonlyargs, args.kw_defaults):
    out.append(_with_default(_arg(a), a.annotation is not None, d))
  if args.kwarg is not None:
    out.append("**" + _arg(args.kwarg))
  return out


def signature(prefix: str, params: list[str], suffix: str = "") -> str:
  inline = f"{prefix}({', '.join(params)}){suffix}"
  if len(inline) <= MAX_SIGNATURE_CHARS or not params:
    return inline
  body = "".join(f"    {p},\n" for p in params)
  return f"{prefix}(\n{body}){suffix}"


def decorators(node) -> list[str]:
  return ["@" + ast.unparse(d) for d in node.decorator_list]


def function_block(node, *, method: bool = False) -> str:
  decos = decorators(node)
  is_property = "@property" in decos
  returns = f" -> {ast.unparse(node.returns)}" if node.returns is not None else ""
  if is_property:
    return f"@property\n{node.name}{returns.replace(' ->', ':')}"
  head = "async def " if isinstance(node, ast.AsyncFunctionDef) else "def "
  sig = signature(head + node.name, parameters(node.args, method=method), returns)
  return "\n".join(decos + [sig])


def _is_dataclass(node: ast.ClassDef) -> bool:
  return any("dataclass" in ast.unparse(d) for d in node.decorator_list)


def class_block(node: ast.ClassDef) -> str:
  """The class line, its dataclass fields or enum members, as in the source."""
  bases = [ast.unparse(b) for b in node.bases] + [ast.unparse(k) for k in node.keywords]
  lines = decorators(node) + [f"class {node.name}" + (f"({', '.join(bases)})" if bases else "")
                              + ":"]
  body = []
  for item in node.body:
    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
      if item.target.id.startswith("_") or "ClassVar" in ast.unparse(item.annotation):
        continue
      text = f"{item.target.id}: {ast.unparse(item.annotation)}"
      if item.value is not None:
        text += f" = {ast.unparse(item.value)}"
      body.append(text)
    elif isinstance(item, ast.Assign) and len(item.targets) == 1 and isinstance(
        item.targets[0], ast.Name) and not item.targets[0].id.startswith("_"):
      body.append(f"{item.targets[0].id} = {ast.unparse(item.value)}")
  if not body:
    body = ["..."]
  return "\n".join(lines + ["    " + b for b in body])


def methods(node: ast.ClassDef) -> list[ast.FunctionDef]:
  out = []
  for item in node.body:
    if not isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
      continue
    name = item.name
    if name.startswith("__") and name.endswith("__"):
      if name in SHOWN_DUNDERS or ast.get_docstring(item):
        out.append(item)
    elif not name.startswith("_"):
      out.append(item)
  return out


def code(text: str, lang: str = "python") -> str:
  return f"```{lang}\n{text}\n```\n"


def doc_text(text: str) -> str:
  """A docstring, verbatim, in a text block (it is written as plain text)."""
  if not text:
    return "*(no docstring)*\n"
  return code(text, "text")


def render_definition(src: Source, node: ast.stmt, qualname: str, level: int = 3) -> str:
  hashes = "#" * level
  out = [f"{hashes} `{qualname}`\n"]
  if isinstance(node, ast.ClassDef):
    out.append(code(class_block(node)))
    out.append(doc_text(ast.get_docstring(node) or ""))
    for m in methods(node):
      out.append(f"{hashes}# `{qualname}.{m.name}`\n")
      out.append(code(function_block(m, method="@staticmethod" not in decorators(m))))
      out.append(doc_text(ast.get_docstring(m) or ""))
  elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
    out.append(code(function_block(node)))
    out.append(doc_text(ast.get_docstring(node) or ""))
  else:  # an assignment: a constant or module-level object
    name = defined_name(node)
    value = node.value
    annotation = (f": {ast.unparse(node.annotation)}"
                  if isinstance(node, ast.AnnAssign) else "")
    if value is None:
      text = f"{name}{annotation}"
    else:
      seg = src.segment(value)
      n_lines = seg.count("\n") + 1
      if n_lines > MAX_VALUE_LINES:
        seg = f"...  # {n_lines} lines: see {src.path.relative_to(ROOT)}"
      text = f"{name}{annotation} = {seg}"
    out.append(code(text))
    comment = src.comment_of(node)
    out.append(doc_text(comment) if comment else "*(no comment in the source)*\n")
  return "\n".join(out)


# --- the page ------------------------------------------------------------------------


def package_exports() -> tuple[list[str], dict[str, tuple[str, str]]]:
  """jax_llar's ``__all__`` and, per name, (defining module, name there)."""
  src = Source("jax_llar")
  exports: list[str] = []
  origin: dict[str, tuple[str, str]] = {}
  for node in src.tree.body:
    if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("jax_llar"):
      for alias in node.names:
        origin[alias.asname or alias.name] = (node.module, alias.name)
    if defined_name(node) == "__all__":
      exports = list(ast.literal_eval(node.value))
  return exports, origin


def render_package() -> tuple[str, set[str]]:
  """The section of ``jax_llar`` itself; also the qualified names it covers."""
  src = Source("jax_llar")
  exports, origin = package_exports()
  out = ["## `jax_llar`\n", doc_text(src.docstring)]
  covered: set[str] = set()
  ordered = [n for n in PACKAGE_ORDER if n in exports]
  ordered += [n for n in exports if n not in ordered]
  for name in ordered:
    module, original = origin[name]
    if module == "jax_llar":  # a submodule: from jax_llar import config
      target = f"jax_llar.{original}"
      out.append(f"### `jax_llar.{name}`\n")
      out.append(f"The module `{target}`: see [Module `{target}`]"
                 f"(#{slug('Module ' + target)}).\n")
      continue
    msrc = Source(module)
    node = msrc.find(original)
    if node is None:
      raise SystemExit(f"gen_api: jax_llar.{name}: {original} not found in {module}")
    out.append(render_definition(msrc, node, f"jax_llar.{name}"))
    out.append(f"Defined in `{module}`.\n")
    covered.add(f"{module}.{original}")
  return "\n".join(out), covered


def render_module(name: str, covered: set[str], internal: bool) -> str:
  src = Source(name)
  title = f"Module `{name}`"
  out = [f"## {title}\n"]
  if internal:
    out.append("*Internal: documented for completeness; use the names `jax_llar` "
               "exports.*\n")
  out.append(doc_text(src.docstring))
  for node in src.definitions():
    defined = defined_name(node)
    qual = f"{name}.{defined}"
    if qual in covered:
      _, origin = package_exports()
      exported = next(k for k, v in origin.items() if v == (name, defined))
      out.append(f"### `{qual}`\n")
      out.append(f"The same object as [`jax_llar.{exported}`]"
                 f"(#{slug('jax_llar.' + exported)}).\n")
      continue
    out.append(render_definition(src, node, qual))
  return "\n".join(out)


def _tool_env() -> dict[str, str]:
  """A fixed environment for the tools' help: no jax_llar settings, CPU only,
  the scratch folder at /tmp."""
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(("JAX_LLAR_", "XLA_", "JAX_", "TMP", "TEMP"))}
  env.update(TMPDIR="/tmp", JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
  return env


def tool_help(tool: str) -> str:
  p = subprocess.run([sys.executable, "-m", f"jax_llar.tools.{tool}", "--help"],
                     cwd=ROOT, env=_tool_env(), capture_output=True, text=True, timeout=120)
  # jax_llar's tools exit with 0 after --help (tools/_cli.py), absl's own help
  # with 1; either way the help is on stdout.
  if p.returncode not in (0, 1) or "flags:" not in p.stdout:
    raise SystemExit(f"gen_api: python -m jax_llar.tools.{tool} --help exited with "
                     f"{p.returncode}:\n{p.stderr[-2000:]}")
  text = p.stdout.rstrip() + "\n"
  # The module's path as absl prints it: from the package on.
  text = re.sub(r"^\S*?(jax_llar/tools/[\w/]+\.py:)$", r"\1", text, flags=re.M)
  # The scratch folder's default: TMPDIR, as the tools' own text says.
  text = text.replace("'/tmp/jax_llar_results'", "'$TMPDIR/jax_llar_results'")
  return text


def render_tools() -> str:
  out = ["## Command-line tools\n",
         "Each tool's `--help`, as printed (absl flags: `--flag=value` or `--flag value`; "
         "`--helpfull` adds absl's own flags). The tools are never imported by the "
         "library; most need CUDA GPUs and the extension (each says so in its text).\n"]
  with concurrent.futures.ThreadPoolExecutor(max_workers=len(TOOLS)) as pool:
    helps = list(pool.map(tool_help, TOOLS))
  for tool, text in zip(TOOLS, helps):
    out.append(f"### `python -m jax_llar.tools.{tool}`\n")
    out.append(code(text.rstrip("\n"), "text"))
  return "\n".join(out)


def generate() -> str:
  """The text of docs/api.md."""
  package, covered = render_package()
  public = [render_module(m, covered, internal=False) for m in PUBLIC_MODULES]
  internal = [render_module(m, covered, internal=True) for m in INTERNAL_MODULES]
  contents = ["- [`jax_llar`](#jax_llar)"]
  contents += [f"- [`{m}`](#{slug('Module ' + m)})" for m in PUBLIC_MODULES]
  contents += ["- [Command-line tools](#command-line-tools)"]
  contents += ["- Internal modules: " + ", ".join(
      f"[`{m}`](#{slug('Module ' + m)})" for m in INTERNAL_MODULES)]
  head = (
      "# API reference\n\n"
      "<!-- Generated by docs/gen_api.py from the docstrings; do not edit by hand. "
      "Regenerate with: python docs/gen_api.py -->\n\n"
      "Generated from the source by [`docs/gen_api.py`](gen_api.py) (docstrings, "
      "signatures and the comment above each constant; the tools' `--help`). "
      "Regenerate it after changing a docstring: `python docs/gen_api.py` "
      "(`tests/test_docs.py` fails while it is stale). Settings and environment "
      "variables are explained in [settings.md](settings.md), dispatch in "
      "[dispatch.md](dispatch.md).\n\n"
      "Docstrings are shown as written (plain text; ``double backticks`` mark code).\n\n"
      + "\n".join(contents) + "\n")
  text = "\n".join([head, package, *public, render_tools(),
                    "# Internal modules\n", *internal])
  text = re.sub(r"\n{3,}", "\n\n", text).rstrip("\n") + "\n"
  check_anchors(text)
  return text


def anchors(text: str) -> set[str]:
  """The anchors GitHub gives the headings of Markdown `text` (a repeated
  anchor gets -1, -2, ...); headings inside fenced code do not count."""
  in_code = False
  seen: set[str] = set()
  for line in text.splitlines():
    if line.startswith("```"):
      in_code = not in_code
      continue
    if not in_code and re.match(r"#{1,6} ", line):
      base = anchor = slug(line.lstrip("#"))
      n = 0
      while anchor in seen:
        n += 1
        anchor = f"{base}-{n}"
      seen.add(anchor)
  return seen


def check_anchors(text: str) -> None:
  """Every #link of the page lands on a heading."""
  seen = anchors(text)
  for target in re.findall(r"\]\(#([^)]+)\)", text):
    if target not in seen:
      raise SystemExit(f"gen_api: a link to #{target}, which no heading has")


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", default=str(ROOT / "docs"), help="folder to write api.md to")
  ap.add_argument("--check", action="store_true",
                  help="compare with docs/api.md instead of writing")
  a = ap.parse_args()
  text = generate()
  if a.check:
    current = (ROOT / "docs" / "api.md").read_text()
    if current != text:
      print("docs/api.md is stale: run python docs/gen_api.py", file=sys.stderr)
      return 1
    return 0
  path = pathlib.Path(a.out) / "api.md"
  path.write_text(text)
  print(f"wrote {path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
