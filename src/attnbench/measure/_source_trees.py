"""Whether attnbench's packages come from one tree: its core, and the folders pyproject maps into it.

pyproject maps ``impls/``, ``reports/`` and ``suites/`` at the repository's root into the package
(``attnbench.impls`` …), outside ``src/``. So ``PYTHONPATH=<clone>/src`` beside another install of attnbench
(an editable one, whose finder answers for the mapped names) runs the clone's core with the other tree's
contenders and reports: ``ab --base`` then times the other tree's code, and meta.json records the clone's
commit beside rows measured with other code. :func:`check_one_tree` refuses such a mix at the command's start.

Two layouts are one tree: the source layout (``TREE/src/attnbench`` with ``TREE/impls`` …, an editable
install) and the installed one (``…/attnbench`` with ``…/attnbench/impls`` …, a plain install into
site-packages, or an editable install's link tree). A mapped package found nowhere (the clone's src/ on
PYTHONPATH beside a plain install, whose mapped packages lie inside its own folder) is refused alike.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from attnbench.errors import UsageError

MAPPED = ("impls", "reports", "suites")  # pyproject's package-dir, besides the core


def _folder(name: str) -> Path | None:
    """The folder package ``name`` is (or would be) imported from, without running its ``__init__``."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations))).absolute()
    return Path(spec.origin).absolute().parent if spec.origin else None


def source_tree(core: Path) -> Path | None:
    """The repository a core folder lies in (``TREE`` for ``TREE/src/attnbench``), or None when installed."""
    return core.parent.parent if core.parent.name == "src" else None


def mixed(core: Path, found: dict[str, Path]) -> list[str]:
    """The mapped packages in ``found`` ({name: folder}) that lie in neither of ``core``'s layouts: empty when
    all come from one tree. The layout is read from the paths as imported, then compared with links resolved: a
    view of links (``attnbench/impls`` → ``TREE/impls``, as the lint session makes) is one tree too."""
    tree = source_tree(core)
    roots = [core, tree] if tree else [core]
    return [
        name for name, folder in found.items() if folder.resolve() not in {(root / name).resolve() for root in roots}
    ]


def check_one_tree() -> None:
    """UsageError, in one line, when a mapped package comes from another tree than the core, or from none
    (module docstring)."""
    core = Path(next(iter(sys.modules["attnbench"].__path__))).absolute()  # imported: this module is in it
    found = {name: folder for name in MAPPED if (folder := _folder(f"attnbench.{name}")) is not None}
    others, missing = mixed(core, found), [name for name in MAPPED if name not in found]
    if not others and not missing:
        return
    tree = source_tree(core)
    where = ", ".join(
        [*(f"attnbench.{name} from {found[name]}" for name in others), *(f"no attnbench.{name}" for name in missing)]
    )
    fix = (
        f"install one tree: `pip install -e {tree}` (the checkout the core is from), or run without the PYTHONPATH "
        "that puts its src/ first"
        if tree
        else "install one tree: `pip install -e .` in the checkout you mean, and run without PYTHONPATH"
    )
    raise UsageError(
        f"attnbench's packages come from different trees: its core from {core}, {where} (pyproject maps "
        f"impls/, reports/ and suites/ into the package from outside src/, so PYTHONPATH=…/src is not enough); {fix}"
    )
