"""The layer rule, checked on the import graph (docs/architecture.md, ../shared/DESIGN.md).

Every `import` and `from ... import` of every module of the seven packages is read with `ast`,
those inside functions, methods and `if TYPE_CHECKING:` blocks included (a lazy import is still
a dependency: it only moves the failure to run time), relative imports resolved. Then:

- between packages, each imports only the packages its row of MAY_IMPORT names (itself always);
- inside dapo_core, each folder (or top-level module) is a layer of DAPO_CORE_LAYERS and imports
  only the layers below its own: nothing sideways, nothing upward;
- dapo_common imports only the standard library; dapo_core none of the orchestration and storage
  libraries; db and dashboard no training stack, not even through a module they import.

The checker is tested on a tiny fake tree with planted violations, so that a checker which finds
nothing is told apart from a tree that has nothing to find.
"""

from __future__ import annotations

import ast
import graphlib
import sys
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("dapo_common", "dapo_core", "db", "flows", "dashboard", "dapo_lab", "bench")

MAY_IMPORT: dict[str, frozenset[str]] = {
    # The leaf: metric names, small helpers, the command line's value types.
    "dapo_common": frozenset(),
    # The algorithm and the trainer, a plain library: it reports through protocols.
    "dapo_core": frozenset({"dapo_common"}),
    # The store: readable by a machine without torch.
    "db": frozenset({"dapo_common"}),
    # Places the work: drives dapo_core, writes through db.
    "flows": frozenset({"dapo_common", "dapo_core", "db"}),
    # Reads db; its one write asks Prefect for a flow run (see EXCEPTIONS).
    "dashboard": frozenset({"dapo_common", "db"}),
    # The `dapo` console script: above every layer, it registers each layer's commands.
    "dapo_lab": frozenset({"dapo_common", "dapo_core", "db", "flows", "dashboard"}),
    # Benchmarks measure every layer; nothing imports them.
    "bench": frozenset({"dapo_common", "dapo_core", "db", "flows", "dashboard", "dapo_lab"}),
}

EXCEPTIONS: dict[str, frozenset[str]] = {
    # The rerun button fills the arm flow's own parameter model (pydantic, over dapo_core's
    # torch-free config), so a rerun the flow would refuse is refused on the page.
    "dashboard": frozenset({"flows.params"}),
}

DAPO_CORE_LAYERS: tuple[tuple[str, ...], ...] = (
    ("algo",),  # pure math over tensors, the registries of variants
    ("cache", "data", "setup"),  # the cache directory; problems and tasks; configs, presets, plan
    ("real_model",),  # the real model's files: download, conversion, checks
    ("engines", "models"),  # the rollout engines; the policy (tiny model, warm start, loading)
    ("train",),  # the stateful trainer: rollout, update, checkpoints, workers
    ("cli", "config_cli"),  # the `dapo` commands dapo_core registers
)

TRAINING_STACK = frozenset({"torch", "transformers", "tokenizers", "safetensors", "vllm", "ray"})
FORBIDDEN_LIBRARIES: dict[str, frozenset[str]] = {
    "dapo_core": frozenset({"prefect", "ray", "sqlalchemy", "alembic", "streamlit", "altair"}),
    "db": TRAINING_STACK | {"prefect", "streamlit"},
    "dashboard": TRAINING_STACK,
}
# The packages whose every reachable project module must be free of FORBIDDEN_LIBRARIES.
TRANSITIVE = ("db", "dashboard")


@dataclass(frozen=True)
class Import:
    importer: str  # the importing module, dotted
    name: str  # what it imports, dotted and absolute ("pkg.mod" or "pkg.mod.Name")
    where: str  # path:line, for the message


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(root: Path, path: Path) -> list[Import]:
    """Every import statement anywhere in the file, as absolute dotted names. A `from m import a`
    gives `m.a` (a may be a submodule or a name in m). In a folder of scripts (bench/, no
    __init__.py), a bare `import x` of a sibling file is that sibling module."""
    module = module_name(root, path)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found: list[Import] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(
                    package[: len(package) - node.level + 1]
                    + ([node.module] if node.module else [])
                )
            else:
                base = node.module or ""
            names = [f"{base}.{alias.name}" for alias in node.names]
        for name in names:
            head = name.split(".")[0]
            if (
                not (path.parent / "__init__.py").is_file()
                and (path.parent / f"{head}.py").is_file()
            ):
                name = ".".join([*package, name])  # a sibling script
            found.append(Import(module, name, f"{path.relative_to(root)}:{node.lineno}"))
    return found


def import_graph(root: Path, packages: Iterable[str]) -> tuple[set[str], list[Import]]:
    """(the project's module names, every import of every module of `packages`)."""
    modules: set[str] = set()
    imports: list[Import] = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            modules.add(module_name(root, path))
            imports.extend(imports_of(root, path))
    return modules, imports


def _top(name: str) -> str:
    return name.split(".")[0]


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def package_violations(
    imports: Sequence[Import],
    may_import: Mapping[str, frozenset[str]],
    exceptions: Mapping[str, frozenset[str]],
) -> list[str]:
    bad = []
    for imp in imports:
        src, dst = _top(imp.importer), _top(imp.name)
        if dst == src or dst not in may_import or dst in may_import[src]:
            continue
        if any(_under(imp.name, allowed) for allowed in exceptions.get(src, ())):
            continue
        bad.append(f"{imp.where}: {src} imports {imp.name}")
    return bad


def _unit(package: str, name: str, modules: set[str]) -> str | None:
    """The folder or top-level module of `package` that `name` lies in; None for the package
    itself (its __init__)."""
    parts = name.split(".")
    if len(parts) < 2 or f"{package}.{parts[1]}" not in modules:
        return None
    return parts[1]


def layer_violations(
    imports: Sequence[Import],
    modules: set[str],
    package: str,
    layers: Sequence[Sequence[str]],
) -> list[str]:
    level = {unit: i for i, units in enumerate(layers) for unit in units}
    units = {_unit(package, m, modules) for m in modules if _top(m) == package} - {None}
    bad = [f"{package}.{u} is in no layer: place it in the layer table" for u in units - set(level)]
    for imp in imports:
        if _top(imp.importer) != package or _top(imp.name) != package:
            continue
        src, dst = _unit(package, imp.importer, modules), _unit(package, imp.name, modules)
        if src is None or dst is None or src == dst or src not in level or dst not in level:
            continue
        if level[dst] >= level[src]:
            way = "sideways" if level[dst] == level[src] else "upward"
            bad.append(f"{imp.where}: {package}.{src} imports {imp.name} ({way})")
    return bad


def _is_project(name: str, packages: Iterable[str]) -> bool:
    return _top(name) in set(packages)


def library_violations(
    imports: Sequence[Import],
    packages: Sequence[str],
    forbidden: Mapping[str, frozenset[str]],
    leaf: str,
) -> list[str]:
    bad = []
    for imp in imports:
        src, lib = _top(imp.importer), _top(imp.name)
        if _is_project(imp.name, packages) or not lib:
            continue
        if src == leaf and lib not in sys.stdlib_module_names:
            bad.append(f"{imp.where}: {leaf} imports {imp.name} (standard library only)")
        elif lib in forbidden.get(src, ()):
            bad.append(f"{imp.where}: {src} imports {imp.name}")
    return bad


def _resolve(name: str, modules: set[str]) -> str | None:
    """The module a dotted name lives in: its longest prefix that is a module of the tree."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in modules:
            return ".".join(parts[:end])
    return None


def transitive_violations(
    imports: Sequence[Import],
    modules: set[str],
    roots: Sequence[str],
    forbidden: Mapping[str, frozenset[str]],
) -> list[str]:
    """A module of `roots` that reaches, through the project's own modules, one that imports a
    library its package may not: the chain, so that the arrow to cut is plain."""
    edges: dict[str, set[str]] = {}
    libs: dict[str, dict[str, str]] = {}
    for imp in imports:
        target = _resolve(imp.name, modules)
        if target is not None:
            # Importing a.b.c runs a/__init__ and a/b/__init__ too.
            parts = target.split(".")
            for end in range(1, len(parts) + 1):
                if ".".join(parts[:end]) in modules and ".".join(parts[:end]) != imp.importer:
                    edges.setdefault(imp.importer, set()).add(".".join(parts[:end]))
        elif _top(imp.name):
            libs.setdefault(imp.importer, {}).setdefault(_top(imp.name), imp.where)
    bad = []
    for package in roots:
        banned = forbidden[package]
        start = sorted(m for m in modules if _top(m) == package)
        parent: dict[str, str | None] = dict.fromkeys(start)
        queue = deque(start)
        while queue:
            module = queue.popleft()
            for lib, where in sorted(libs.get(module, {}).items()):
                if lib in banned and _top(module) != package:
                    chain, step = [], module
                    while step is not None:
                        chain.append(step)
                        step = parent[step]
                    path = " -> ".join(reversed(chain))
                    bad.append(f"{package} reaches {lib}: {path} ({where})")
            for nxt in sorted(edges.get(module, ())):
                if nxt not in parent:
                    parent[nxt] = module
                    queue.append(nxt)
    return bad


def import_cycle(imports: Sequence[Import], modules: set[str]) -> list[str]:
    """One cycle of module imports, as the modules around it (empty when there is none). A cycle
    works only while every module in it imports the others lazily or late; the first top-level
    `from a import b` added to one of them fails at import time, far from the change that did it.
    Each import counts as an arrow to the module the name lives in (`from a import b` to `a.b`
    when that is a module, else to `a`)."""
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for imp in imports:
        target = _resolve(imp.name, modules)
        if target is not None and target != imp.importer:
            graph[imp.importer].add(target)
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as cycle:
        return list(cycle.args[1])
    return []


def violations(
    root: Path,
    packages: Sequence[str] = PACKAGES,
    may_import: Mapping[str, frozenset[str]] = MAY_IMPORT,
    exceptions: Mapping[str, frozenset[str]] = EXCEPTIONS,
    core: str = "dapo_core",
    layers: Sequence[Sequence[str]] = DAPO_CORE_LAYERS,
    forbidden: Mapping[str, frozenset[str]] = FORBIDDEN_LIBRARIES,
    transitive: Sequence[str] = TRANSITIVE,
    leaf: str = "dapo_common",
) -> list[str]:
    modules, imports = import_graph(root, packages)
    return [
        *package_violations(imports, may_import, exceptions),
        *layer_violations(imports, modules, core, layers),
        *library_violations(imports, packages, forbidden, leaf),
        *transitive_violations(imports, modules, transitive, forbidden),
    ]


# --- the project ---------------------------------------------------------------------------------
def test_every_package_is_in_the_rule() -> None:
    found = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file() and p.name != "tests"}
    assert found <= set(PACKAGES), (
        f"packages the layer rule does not cover: {found - set(PACKAGES)}"
    )
    assert set(MAY_IMPORT) == set(PACKAGES)


def test_the_project_keeps_its_layers() -> None:
    bad = violations(ROOT)
    assert not bad, "the layer rule is broken:\n" + "\n".join(bad)


def test_no_module_imports_itself_through_others() -> None:
    modules, imports = import_graph(ROOT, PACKAGES)
    cycle = import_cycle(imports, modules)
    assert not cycle, "an import cycle: " + " -> ".join(cycle)


def test_the_graph_is_read_whole() -> None:
    """Lazy imports inside functions and relative imports are in the graph (a checker that read
    only the top of each file would pass an upward import hidden in a function)."""
    modules, imports = import_graph(ROOT, PACKAGES)
    assert {"dapo_core.train.trainer", "db.store", "flows.arm", "bench.gpu_check"} <= modules
    names = {(i.importer, i.name) for i in imports}
    # dapo_core/cli.py imports the trainer inside `dapo eval`'s function, not at the top.
    assert ("dapo_core.cli", "dapo_core.train.runner.evaluate_checkpoint") in names
    # bench/bench_curves.py imports a sibling script by its bare name.
    assert ("bench.bench_curves", "bench.bench_scale") in names


# --- the checker, on a tiny fake tree with planted violations ------------------------------------
FAKE: dict[str, str] = {
    "leaf/__init__.py": "",
    "leaf/names.py": "import json\n",
    "core/__init__.py": "",
    "core/math/__init__.py": "",
    "core/math/loss.py": "import torch\nfrom leaf.names import json\n",
    "core/math/names.py": "LOSSES = ('token-mean',)\n",
    "core/setup/__init__.py": "",
    "core/setup/config.py": "from ..math import names\n",
    "core/train/__init__.py": "",
    "core/train/step.py": "from core.setup.config import names\nfrom core.math.loss import torch\n",
    "store/__init__.py": "",
    "store/tables.py": "import sqlite3\nfrom leaf import names\n",
    "ui/__init__.py": "",
    "ui/page.py": "from store import tables\nfrom web.params import Form\n",
    "web/__init__.py": "",
    "web/params.py": "from core.setup import config\n",
    "web/flow.py": "from core.train import step\nfrom store.tables import sqlite3\n",
}
FAKE_RULES: dict[str, frozenset[str]] = {
    "leaf": frozenset(),
    "core": frozenset({"leaf"}),
    "store": frozenset({"leaf"}),
    "web": frozenset({"leaf", "core", "store"}),
    "ui": frozenset({"leaf", "store"}),
}
FAKE_LAYERS = (("math",), ("setup",), ("train",))
FAKE_FORBIDDEN = {"store": frozenset({"torch"}), "ui": frozenset({"torch"})}


def _fake_tree(root: Path, **planted: str) -> Path:
    for rel, text in {**FAKE, **planted}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _check(root: Path) -> list[str]:
    return violations(
        root,
        packages=tuple(FAKE_RULES),
        may_import=FAKE_RULES,
        exceptions={"ui": frozenset({"web.params"})},
        core="core",
        layers=FAKE_LAYERS,
        forbidden=FAKE_FORBIDDEN,
        transitive=("store", "ui"),
        leaf="leaf",
    )


def test_checker_passes_a_clean_tree(tmp_path: Path) -> None:
    assert _check(_fake_tree(tmp_path)) == []


def test_checker_finds_an_import_across_packages_inside_a_function(tmp_path: Path) -> None:
    tree = _fake_tree(
        tmp_path,
        **{"store/tables.py": "import sqlite3\n\n\ndef f():\n    from core.math import loss\n"},
    )
    assert _check(tree) == [
        "store/tables.py:5: store imports core.math.loss",
        # ... and with it torch, one module away: the chain says which arrow to cut.
        "store reaches torch: store.tables -> core.math.loss (core/math/loss.py:1)",
        "ui reaches torch: ui.page -> store.tables -> core.math.loss (core/math/loss.py:1)",
    ]


def test_checker_finds_an_upward_layer_import(tmp_path: Path) -> None:
    tree = _fake_tree(tmp_path, **{"core/setup/config.py": "from ..train import step\n"})
    assert _check(tree) == [
        "core/setup/config.py:1: core.setup imports core.train.step (upward)",
        # The rerun form's parameter model now pulls in the trainer, and torch with it.
        "ui reaches torch: ui.page -> web.params -> core.setup.config -> core.train.step "
        "-> core.math.loss (core/math/loss.py:1)",
    ]


def test_checker_finds_a_sideways_import_and_an_unplaced_folder(tmp_path: Path) -> None:
    tree = _fake_tree(
        tmp_path,
        **{"core/data/__init__.py": "", "core/data/tasks.py": "from core.train.step import x\n"},
    )
    layers = (("math",), ("setup", "data"), ("train",))
    assert layer_violations(*_graph(tree), "core", FAKE_LAYERS) == [
        "core.data is in no layer: place it in the layer table"
    ]
    (tree / "core/data/tasks.py").write_text("from core.setup import config\n")
    assert layer_violations(*_graph(tree), "core", layers) == [
        "core/data/tasks.py:1: core.data imports core.setup.config (sideways)",
    ]


def _graph(root: Path) -> tuple[list[Import], set[str]]:
    modules, imports = import_graph(root, tuple(FAKE_RULES))
    return imports, modules


def test_checker_finds_a_library_the_leaf_or_a_layer_may_not_import(tmp_path: Path) -> None:
    tree = _fake_tree(
        tmp_path,
        **{"leaf/names.py": "import json\nimport numpy\n", "ui/page.py": "import torch.nn\n"},
    )
    assert _check(tree) == [
        "leaf/names.py:2: leaf imports numpy (standard library only)",
        "ui/page.py:1: ui imports torch.nn",
    ]


def test_checker_allows_only_the_named_exception(tmp_path: Path) -> None:
    tree = _fake_tree(tmp_path, **{"ui/page.py": "from web.flow import run\n"})
    assert _check(tree) == [
        "ui/page.py:1: ui imports web.flow.run",
        # web.flow reaches core.train, whose layers below import torch.
        "ui reaches torch: ui.page -> web.flow -> core.train.step -> core.math.loss "
        "(core/math/loss.py:1)",
    ]


def test_checker_finds_an_import_cycle_inside_a_package(tmp_path: Path) -> None:
    tree = _fake_tree(tmp_path)
    assert import_cycle(*_graph(tree)) == []
    (tree / "core/math/names.py").write_text("def f():\n    from core.math import loss\n")
    (tree / "core/math/loss.py").write_text("from core.math.names import LOSSES\n")
    cycle = import_cycle(*_graph(tree))
    assert set(cycle) == {"core.math.names", "core.math.loss"} and cycle[0] == cycle[-1]


def test_the_suites_longest_first_list_names_modules_that_exist() -> None:
    # conftest.LONGEST_FIRST orders `make test`'s files; a renamed module would silently fall
    # back to alphabetical order and leave a core idle at the end again.
    from conftest import LONGEST_FIRST

    tests = Path(__file__).parent
    assert [name for name in LONGEST_FIRST if not (tests / name).is_file()] == []
