"""The documentation (issue 14, item 3): docs/api.md is what docs/gen_api.py
writes from the current source, every public name and command-line tool has
an entry there, every setting and environment variable of jax_llar.config is
on the settings page, and every relative link of README.md and docs/*.md
lands on a file (and, for a link into a Markdown file, on a heading)."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import pathlib
import re
import tomllib

import pytest

import jax_llar
from jax_llar import config

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def _gen_api():
  spec = importlib.util.spec_from_file_location("gen_api", DOCS / "gen_api.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


GEN = _gen_api()


@pytest.fixture(scope="module")
def api_text() -> str:
  return (DOCS / "api.md").read_text()


def test_api_reference_is_current(tmp_path):
  """docs/api.md equals the generator's output (run python docs/gen_api.py
  after changing a docstring, a signature or a tool's flags)."""
  out = tmp_path / "docs"
  out.mkdir()
  (out / "api.md").write_text(GEN.generate())
  assert (out / "api.md").read_text() == (DOCS / "api.md").read_text(), (
      "docs/api.md is stale: run python docs/gen_api.py")


def _defined_here(module) -> list[str]:
  """Public names the module defines itself: functions and classes whose
  __module__ is the module, and top-level assignments in its source."""
  source = inspect.getsource(module)
  names = []
  for name, value in vars(module).items():
    if name.startswith("_") or inspect.ismodule(value):
      continue
    if (inspect.isfunction(value) or inspect.isclass(value)) and (
        getattr(value, "__module__", None) == module.__name__):
      names.append(name)
    elif re.search(rf"^{re.escape(name)}\s*(:[^=\n]*)?=", source, re.M):
      names.append(name)
  return names


def test_every_exported_name_has_an_entry(api_text):
  for name in jax_llar.__all__:
    assert f"### `jax_llar.{name}`" in api_text, name


@pytest.mark.parametrize("module_name", GEN.PUBLIC_MODULES + GEN.INTERNAL_MODULES)
def test_every_public_name_of_the_modules_has_an_entry(api_text, module_name):
  module = importlib.import_module(module_name)
  assert f"## Module `{module_name}`" in api_text
  names = _defined_here(module)
  assert names, module_name
  missing = [n for n in names if f"### `{module_name}.{n}`" not in api_text]
  assert not missing, (module_name, missing)


def test_every_command_line_tool_has_an_entry(api_text):
  tools_dir = ROOT / "jax_llar" / "tools"
  tools = sorted([p.stem for p in tools_dir.glob("*.py")
                  if 'if __name__ == "__main__":' in p.read_text()] +
                 [p.parent.name for p in tools_dir.glob("*/__main__.py")])
  assert set(tools) == set(GEN.TOOLS), tools
  for tool in tools:
    assert f"### `python -m jax_llar.tools.{tool}`" in api_text, tool


def test_every_setting_and_environment_variable_is_documented():
  page = (DOCS / "settings.md").read_text()
  for field in dataclasses.fields(config.Settings):
    assert f"`{field.name}`" in page, field.name
  variables = set(re.findall(r"\bJAX_LLAR_[A-Z_]+\b", config.__doc__))
  assert variables
  for var in sorted(variables):
    assert f"`{var}`" in page, var


def _links(path: pathlib.Path) -> list[str]:
  """The targets of the Markdown links and images of `path`, outside code."""
  targets, in_code = [], False
  for line in path.read_text().splitlines():
    if line.startswith("```"):
      in_code = not in_code
      continue
    if in_code:
      continue
    line = re.sub(r"`[^`]*`", "", line)  # code spans hold no links
    targets += re.findall(r"\]\(([^)\s]+)\)", line)
  return targets


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_lands(page):
  assert _links(page) or page.name == "api.md", page
  for target in _links(page):
    if re.match(r"[a-z]+:", target):  # https:, mailto:
      continue
    path, _, anchor = target.partition("#")
    dest = (page.parent / path).resolve() if path else page
    assert dest.exists(), (page.name, target)
    if anchor and dest.suffix == ".md":
      assert anchor in GEN.anchors(dest.read_text()), (page.name, target)


def test_the_readme_keeps_the_ci_test_command_and_links_every_page():
  readme = (ROOT / "README.md").read_text()
  ci = (ROOT / ".ci" / "run").read_text()
  command = ("python -m pip install --group build && "
             "python -m pip install --no-build-isolation -e '.[test]' && "
             "python -m pytest -q -rs tests")
  assert command in ci and command in readme
  linked = {pathlib.Path(t.partition("#")[0]).name for t in _links(ROOT / "README.md")}
  for page in sorted(DOCS.glob("*.md")):
    assert page.name in linked, page.name
  # Sections the library's docstrings and messages point to (README_SECTION).
  for section in ("## Getting the speed in loops", "## One process per GPU"):
    assert section in readme, section


def test_the_build_group_holds_the_build_requirements():
  """`pip install --group build` (the README's test command) installs the
  packages of [build-system] requires, so a build without isolation has all
  an isolated one has."""
  project = tomllib.loads((ROOT / "pyproject.toml").read_text())

  def names(reqs):
    return sorted(re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower() for r in reqs)

  assert names(project["dependency-groups"]["build"]) == names(
      project["build-system"]["requires"])


def test_benchmarks_point_at_nothing_outside_the_repository():
  """benchmarks/ is self-contained: its pages name no design note or file
  that the repository does not hold."""
  root = pathlib.Path(__file__).resolve().parents[1]
  outside = re.compile(r"MEASURED\.md|BENCHMARK\.md|design folder|design notes|\.\./shared")
  found = [f"{p.name}:{n}" for p in sorted((root / "benchmarks").glob("*.md"))
           for n, line in enumerate(p.read_text().splitlines(), 1) if outside.search(line)]
  assert not found, found
