"""The package imports one way, bottom to top: data → envs → models → rollout/adapters → advantages →
losses/analysis/doctor → render → widgets/train/integrations → cli. Nothing lower imports anything higher, there is no
import circle,
and nothing inside the package imports the top-level ``mpo_viz`` package (``demo.py`` aside: it
reads like user code). Every import counts, also those inside functions."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "mpo_viz"

# rank of each module (by dotted prefix; the longest prefix wins). A module may import modules of
# its own rank or lower. A new module must be placed here.
RANK = {
    "mpo_viz.version": 0,
    "mpo_viz.checks": 0,
    "mpo_viz.options": 0,
    "mpo_viz.timer": 0,
    "mpo_viz.data.schema": 1,
    "mpo_viz.data.ragged": 1,
    "mpo_viz.data.turns": 1,
    "mpo_viz.data.moments": 1,
    "mpo_viz.data.validate": 2,
    "mpo_viz.data.summary": 2,
    "mpo_viz.data.trajectory": 3,
    "mpo_viz.data": 4,
    "mpo_viz.envs": 5,
    "mpo_viz.models": 6,
    "mpo_viz.rollout": 7,
    "mpo_viz.adapters": 7,
    "mpo_viz.advantages": 8,
    "mpo_viz.losses": 9,
    "mpo_viz.analysis": 9,
    "mpo_viz.doctor": 9,
    "mpo_viz.render": 10,
    "mpo_viz.widgets": 11,
    "mpo_viz.train": 11,
    "mpo_viz.integrations": 11,
    "mpo_viz.cli": 12,
    "mpo_viz": 13,  # the package itself: re-exports only, imported by nobody inside
}
ASIDE = {"mpo_viz.demo"}


def _modules() -> dict[str, Path]:
    out = {}
    for f in PKG.rglob("*.py"):
        parts = list(f.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = f
    return out


MODULES = _modules()


def _resolve(name: str) -> str:
    """The module a dotted name refers to (``mpo_viz.advantages.compute`` -> ``mpo_viz.advantages``)."""
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def _imports(mod: str) -> list[tuple[str, int]]:
    """``(imported module, line)`` for every mpo_viz import in ``mod``, wherever it sits."""
    tree = ast.parse(MODULES[mod].read_text(encoding="utf-8"))
    is_pkg = MODULES[mod].name == "__init__.py"
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(_resolve(a.name), node.lineno) for a in node.names if a.name.split(".")[0] == "mpo_viz"]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                anchor = mod.split(".") if is_pkg else mod.split(".")[:-1]
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if base.split(".")[0] != "mpo_viz":
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.append((sub if sub in MODULES else _resolve(base), node.lineno))
    return out


def _rank(mod: str) -> int:
    key = max((k for k in RANK if mod == k or mod.startswith(k + ".")), key=len, default=None)
    if key is None:
        raise AssertionError(f"{mod}: not placed in tests/test_layers.py RANK; give it a layer")
    return RANK[key]


def test_every_module_has_a_layer():
    for mod in MODULES:
        if mod not in ASIDE:
            _rank(mod)


@pytest.mark.parametrize("mod", sorted(m for m in MODULES if m not in ASIDE and m != "mpo_viz"))
def test_nothing_imports_upward_or_the_top_level_package(mod):
    for target, line in _imports(mod):
        where = f"{MODULES[mod].relative_to(PKG.parent)}:{line}"
        assert target != "mpo_viz", f"{where}: imports the top-level mpo_viz package; import the module itself"
        assert target not in ASIDE, f"{where}: imports {target}"
        assert _rank(target) <= _rank(mod), (
            f"{where}: {mod} (layer {_rank(mod)}) imports {target} (layer {_rank(target)}), a higher layer"
        )


def test_no_import_circle():
    graph = {m: sorted({t for t, _ in _imports(m) if t != m and t in MODULES}) for m in MODULES if m not in ASIDE}
    # a package's __init__ importing its own submodules is the package assembling itself, not a dependency
    # of the submodules on the package: drop package -> own child edges before looking for circles
    graph = {m: [t for t in ts if not t.startswith(m + ".")] for m, ts in graph.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for t in graph.get(m, []):
            if state.get(t) == 1:
                raise AssertionError("import circle: " + " -> ".join(stack[stack.index(t) :] + [t]))
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m)


def test_the_checker_sees_what_it_should(tmp_path):
    # the walker finds function-level and relative imports (a check that would pass on nothing is no check)
    assert ("mpo_viz.data.trajectory", 1) in [(t, 1) for t, _ in _imports("mpo_viz.data.io")]
    assert "mpo_viz.advantages.registry" in [t for t, _ in _imports("mpo_viz.analysis.tables")]
    assert _rank("mpo_viz.advantages.kernels") == 8 and _rank("mpo_viz.cli.advantages") == 12


def test_no_private_name_crosses_a_module():
    # a helper used by another module is public (or lives next to its user): no `from m import _x`, no
    # `module._x`, and no reaching into another module's objects' private fields (`batch._tok`);
    # `obj._x` is fine inside the module whose classes set `self._x` (e.g. concat reading other batches)
    bad = []
    for mod, f in MODULES.items():
        tree = ast.parse(f.read_text(encoding="utf-8"))
        own = {
            n.attr
            for n in ast.walk(tree)
            if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name)
            and n.value.id == "self"
            and n.attr.startswith("_")
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mpo_viz"):
                bad += [
                    f"{mod}:{node.lineno} imports {a.name}"
                    for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")
                ]
            elif (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and isinstance(node.value, ast.Name)
                and node.value.id not in ("self", "cls")
                and node.attr not in own
            ):
                if node.attr == "_actions":  # argparse's parser._actions: a third-party object
                    continue
                if ast.unparse(node) == "random._inst":  # the stdlib's generator behind random's functions (envs/rng)
                    continue
                bad.append(f"{mod}:{node.lineno} reads {ast.unparse(node)}")
    assert not bad, "\n".join(bad)


# --------------------------------------------------------------------------------------------- the map

README = PKG.parent / "README.md"
LAYOUT_START = (
    "<!-- layout: generated from tests/test_layers.py RANK and each module's docstring; "
    "`python tests/test_layers.py` rewrites it -->"
)
LAYOUT_END = "<!-- /layout -->"


def summary(mod: str) -> str:
    """The first sentence of ``mod``'s docstring (its first paragraph, cut after the first full stop
    that ends a sentence of at least 30 characters)."""
    doc = ast.get_docstring(ast.parse(MODULES[mod].read_text(encoding="utf-8"))) or ""
    para = " ".join(doc.strip().split("\n\n")[0].split())
    para = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", para).replace("``", "`")  # reST roles and literals as markdown
    for i, ch in enumerate(para):
        if ch == "." and i >= 30 and (i + 1 == len(para) or para[i + 1] == " ") and para[i - 1] not in ".e":
            return para[: i + 1]
    return para


def _path(mod: str) -> str:
    rel = mod.split(".")[1:]
    return "/".join(rel) + ("/" if MODULES[mod].name == "__init__.py" else ".py")


def _children(key: str) -> str:
    """The modules of package ``key`` that have no RANK entry of their own, as ``a, b/ (c, d)``."""

    def own(m):
        return m.startswith(key + ".") and max((k for k in RANK if m == k or m.startswith(k + ".")), key=len) == key

    direct = sorted(m for m in MODULES if own(m) and m.count(".") == key.count(".") + 1)
    parts = []
    for m in direct:
        name = m.rsplit(".", 1)[1]
        if MODULES[m].name == "__init__.py":
            sub = sorted(
                x.rsplit(".", 1)[1] for x in MODULES if x.startswith(m + ".") and x.count(".") == m.count(".") + 1
            )
            name += "/ (" + ", ".join(sub) + ")" if sub else "/"
        parts.append(name)
    return ", ".join(parts)


def layout_block() -> str:
    """The README's "Layout" block: one table row per RANK entry (layer, path, first sentence, the
    package's other modules), the modules set aside, and the import arrows the layers test enforces."""
    rows = ["| layer | module | what it owns |", "|---|---|---|"]
    for key in sorted((k for k in RANK if k != "mpo_viz"), key=lambda k: (RANK[k], k)):
        kids = _children(key) if MODULES[key].name == "__init__.py" else ""
        rows.append(f"| {RANK[key]} | `{_path(key)}` | {summary(key)}" + (f" Modules: {kids}." if kids else "") + " |")
    rows += [f"| – | `{_path(m)}` | {summary(m)} (set aside: it reads like user code) |" for m in sorted(ASIDE)]
    every = ["| module | first sentence of its docstring |", "|---|---|"]
    every += [f"| `{_path(m)}` | {summary(m)} |" for m in sorted(MODULES, key=_path) if m != "mpo_viz"]
    groups = {}
    for k in RANK:
        if k != "mpo_viz":
            groups.setdefault(RANK[k], []).append(k.split(".", 1)[1])
    arrows = " → ".join("/".join(f"`{n}`" for n in sorted(groups[r])) for r in sorted(groups))
    return "\n".join(
        [
            LAYOUT_START,
            "",
            *rows,
            "",
            f"Imports go one way, bottom to top: {arrows}.",
            "",
            "<details><summary>Every module</summary>",
            "",
            *every,
            "",
            "</details>",
            "",
            LAYOUT_END,
        ]
    )


def _committed_layout() -> str:
    text = README.read_text(encoding="utf-8")
    start, end = text.index(LAYOUT_START), text.index(LAYOUT_END) + len(LAYOUT_END)
    return text[start:end]


def test_the_readme_layout_is_the_generated_one():
    assert _committed_layout() == layout_block(), (
        "README.md's Layout differs from tests/test_layers.py RANK and the module docstrings; regenerate it "
        "with `python tests/test_layers.py`"
    )


def test_every_module_is_on_the_map():
    block = layout_block()
    for mod in MODULES:
        if mod == "mpo_viz":
            continue
        name = mod.rsplit(".", 1)[1]
        assert f"`{_path(mod)}`" in block or name in block, f"{mod} is missing from the README layout"


if __name__ == "__main__":
    text = README.read_text(encoding="utf-8")
    README.write_text(text.replace(_committed_layout(), layout_block()), encoding="utf-8")
    print(f"rewrote the Layout block of {README}")
