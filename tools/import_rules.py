"""The import rules ``make lint`` enforces beyond import-linter's layers (issue 23).

1. **The public-API rule.** The entry points (``sessionrepo.integrations``, ``.importers``,
   ``.web``, ``.cli``, ``.ops``) and ``bench/`` use the rest of sessionrepo through its
   public names only. A file there may not:

   - import a private name (``from sessionrepo.store.database import _retry``) or from a
     private module (``sessionrepo.models._limits``) of another package;
   - read a private attribute through something imported from another package
     (``SessionRepository._append``, ``codec._cache``);
   - read a private attribute of any other object (``repo._append(...)``,
     ``getattr(repo, "_sync")``) when that name is a private that another sessionrepo
     package defines and its own package does not: without types, the name is what
     tells a sessionrepo private from a framework's (ADK's ``_storage_update_marker``).

   A package's own privates, ``self._x`` and ``cls._x``, and dunder names are fine.
   ``bench/`` is outside the package, a caller like any user: it may import only what a
   module declares in ``__all__``, or the public names a package's ``__init__`` binds when
   it declares no ``__all__``.

2. **Frozen migrations.** ``migrations/versions/`` imports nothing from the library
   (``sessionrepo``, ``repo``, ``models``): a revision's meaning must not change when
   library code does, so a revision holds frozen copies of what it needs.

3. **Third parties' privates in shims.** A private of another distribution (aiosqlite's
   ``Connection._execute``, SQLAlchemy's ``Pool._invalidate``) is used only in a module
   named ``*_compat.py``, which holds every such use with the version bound it was checked
   on and a test that fails when the installed version lacks it. Everywhere else (the
   package, migrations, bench/), reading ``obj._x`` is reported when no sessionrepo or
   bench code defines ``_x``: then it can only be someone else's. The underscore names
   that are public by design (``Row._mapping``, the named-tuple API) are allowed.

Run ``python tools/import_rules.py [ROOT]``: one line per violation, exit status 1 if any.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

#: Source folder -> the package it is installed as (pyproject's package-dir).
SOURCES: Final = {"repo": "sessionrepo", "models": "sessionrepo.models"}
#: The packages held to the public-API rule; ``bench`` is the outside caller.
CHECKED: Final = (
    "sessionrepo.integrations",
    "sessionrepo.importers",
    "sessionrepo.web",
    "sessionrepo.cli",
    "sessionrepo.ops",
)
OUTSIDE: Final = "bench"
#: What a migration may not import (the installed name and the source folders).
LIBRARY: Final = ("sessionrepo", "repo", "models")
MIGRATIONS: Final = "migrations/versions"


def is_private(name: str) -> bool:
    """``_x`` and ``__x`` are private; ``__x__`` (dunder), ``_x_`` (an enum's documented
    "sunder" names, such as ``_value_``) and ``_`` are not."""
    if not name.startswith("_") or name == "_":
        return False
    dunder = name.startswith("__") and name.endswith("__") and len(name) > 4
    sunder = not name.startswith("__") and name.endswith("_") and not name.endswith("__")
    return not (dunder or (sunder and len(name) > 2))


def package_of(module: str) -> str:
    """The unit whose privates are its own: ``sessionrepo.store.codec`` -> ``sessionrepo.store``;
    a top-level module (``sessionrepo.errors``) is its own; outside sessionrepo, the first
    component (``bench``)."""
    parts = module.split(".")
    if parts[0] != "sessionrepo":
        return parts[0]
    return ".".join(parts[:2])


@dataclass(frozen=True)
class Violation:
    path: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


@dataclass
class ModuleInfo:
    """What the rules need to know of one sessionrepo module."""

    name: str
    is_package: bool
    exports: frozenset[str] | None  # ``__all__``, when declared as a literal
    public: frozenset[str]  # the public names bound at its top level
    privates: frozenset[str]  # every private name it defines (attributes included)


@dataclass
class Index:
    """The sessionrepo modules, and the private names each package defines."""

    modules: dict[str, ModuleInfo] = field(default_factory=dict)
    privates: dict[str, set[str]] = field(default_factory=dict)

    def add(self, info: ModuleInfo) -> None:
        self.modules[info.name] = info
        self.privates.setdefault(package_of(info.name), set()).update(info.privates)

    def defined_elsewhere(self, name: str, own: str) -> bool:
        """Whether a sessionrepo package other than ``own`` defines the private ``name``."""
        return any(
            name in names
            for package, names in self.privates.items()
            if package != own and package.split(".")[0] == "sessionrepo"
        )

    def exported(self, module: str, name: str) -> bool:
        """Whether an outside caller may import ``name`` from ``module``."""
        if f"{module}.{name}" in self.modules:  # a submodule: public if it declares so
            return self.public_module(f"{module}.{name}")
        info = self.modules.get(module)
        if info is None:
            return False
        if info.exports is not None:
            return name in info.exports
        return info.is_package and name in info.public

    def public_module(self, module: str) -> bool:
        info = self.modules.get(module)
        return info is not None and (info.is_package or info.exports is not None)


def _bound_names(tree: ast.Module) -> tuple[frozenset[str] | None, set[str]]:
    exports: frozenset[str] | None = None
    bound: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            if isinstance(node, ast.ImportFrom) and node.module == "__future__":
                continue
            for alias in node.names:
                bound.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    bound.add(target.id)
                    if target.id == "__all__" and node.value is not None:
                        exports = frozenset(ast.literal_eval(node.value))
    return exports, bound


def _defined_privates(tree: ast.AST) -> set[str]:
    """Every private name the code defines: functions, classes, names assigned (class
    bodies included), attributes assigned on ``self`` or ``cls``, import aliases,
    ``__slots__`` entries."""
    found: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.append(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.append(node.id)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
        ):
            # Only on self or cls: ``session._marker = ...`` writes someone's private.
            names.append(node.attr)
        elif isinstance(node, ast.alias):
            names.append((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets
        ):
            names += [
                c.value
                for c in ast.walk(node.value)
                if isinstance(c, ast.Constant) and isinstance(c.value, str)
            ]
        found.update(n for n in names if is_private(n))
    return found


def module_name(root: Path, path: Path) -> str | None:
    """The module a source file is installed or imported as (``None``: not ours)."""
    relative = path.relative_to(root)
    folder = relative.parts[0]
    if folder in SOURCES:
        parts = [*SOURCES[folder].split("."), *relative.parts[1:]]
    elif folder == OUTSIDE:
        parts = list(relative.parts)
    else:
        return None
    parts[-1] = parts[-1].removesuffix(".py")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def build_index(root: Path) -> Index:
    index = Index()
    for folder in (*SOURCES, OUTSIDE):
        for path in sorted((root / folder).rglob("*.py")):
            name = module_name(root, path)
            assert name is not None
            tree = ast.parse(path.read_text(), str(path))
            exports, bound = _bound_names(tree)
            index.add(
                ModuleInfo(
                    name=name,
                    is_package=path.name == "__init__.py",
                    exports=exports,
                    public=frozenset(n for n in bound if not n.startswith("_")),
                    privates=frozenset(_defined_privates(tree)),
                )
            )
    return index


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base.pop()
    if node.level > 1:
        base = base[: len(base) - node.level + 1]
    return ".".join([*base, *([node.module] if node.module else [])])


def _chain(node: ast.Attribute) -> tuple[ast.expr, list[str]]:
    """``a.b.c`` -> (the root expression ``a``, ``["b", "c"]``)."""
    attrs: list[str] = []
    current: ast.expr = node
    while isinstance(current, ast.Attribute):
        attrs.append(current.attr)
        current = current.value
    return current, attrs[::-1]


class _PublicApi(ast.NodeVisitor):
    def __init__(
        self, index: Index, path: str, module: str, is_package: bool, privates: set[str]
    ) -> None:
        self.index, self.path, self.module, self.is_package = index, path, module, is_package
        #: The privates this module defines itself (its own, whatever the receiver).
        self.privates = privates
        self.own = package_of(module)
        self.outside = self.own == OUTSIDE
        #: Names bound by imports from other sessionrepo packages -> what they name.
        self.imported: dict[str, str] = {}
        self.found: list[Violation] = []

    def _report(self, node: ast.AST, message: str) -> None:
        self.found.append(Violation(self.path, getattr(node, "lineno", 0), message))

    def _foreign(self, dotted: str) -> bool:
        return dotted.split(".", maxsplit=1)[0] == "sessionrepo" and package_of(dotted) != self.own

    def _private_part(self, dotted: str) -> str | None:
        return next((part for part in dotted.split(".") if is_private(part)), None)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if not self._foreign(alias.name):
                continue
            if self._private_part(alias.name):
                self._report(node, f"imports the private module {alias.name}")
            elif self.outside and not self.index.public_module(alias.name):
                self._report(node, f"imports {alias.name}, which declares no public names")
            if alias.asname:
                self.imported[alias.asname] = alias.name
            else:
                self.imported[alias.name.split(".")[0]] = alias.name.split(".")[0]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        source = _absolute(node, self.module, self.is_package)
        if not self._foreign(source):
            return
        private = self._private_part(source)
        for alias in node.names:
            target = f"{source}.{alias.name}"
            self.imported[alias.asname or alias.name] = target
            if private:
                self._report(node, f"imports {alias.name} from the private module {source}")
            elif is_private(alias.name):
                self._report(node, f"imports the private name {alias.name} from {source}")
            elif self.outside and not self.index.exported(source, alias.name):
                self._report(node, f"imports {alias.name} from {source}, which does not export it")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        root, attrs = _chain(node)
        if isinstance(root, ast.Name) and root.id in self.imported:
            # Only the outermost attribute of a chain reports (a.b._c._d: once).
            dotted = ".".join([self.imported[root.id], *attrs])
            private = self._private_part(".".join(attrs))
            if private and self._foreign(dotted):
                self._report(node, f"reads the private {private} of {dotted}")
            return  # the whole chain is accounted for: its inner attributes are not visited
        self._private_attribute(node, node.attr)
        self.generic_visit(node)

    def _private_attribute(self, node: ast.Attribute | ast.Call, name: str) -> None:
        receiver = node.value if isinstance(node, ast.Attribute) else node.args[0]
        if isinstance(receiver, ast.Name) and receiver.id in ("self", "cls"):
            return
        if not is_private(name) or name in self.privates:
            return
        if self.index.defined_elsewhere(name, self.own):
            self._report(node, f"reads {name}, a private of another sessionrepo package")

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if (
            isinstance(func, ast.Name)
            and func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            self._private_attribute(node, node.args[1].value)
        self.generic_visit(node)


def public_api_violations(
    index: Index, source: str, path: str, module: str, *, is_package: bool = False
) -> list[Violation]:
    """The public-API rule's violations in one file (``module``: the name it imports as)."""
    tree = ast.parse(source, path)
    checker = _PublicApi(index, path, module, is_package, _defined_privates(tree))
    checker.visit(tree)
    return checker.found


def migration_violations(source: str, path: str) -> list[Violation]:
    """Imports of the library in a migration revision."""
    found: list[Violation] = []
    for node in ast.walk(ast.parse(source, path)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = ["." * node.level + (node.module or "")]
        else:
            continue
        for name in names:
            if name.startswith(".") or name.split(".")[0] in LIBRARY:
                found.append(
                    Violation(path, node.lineno, f"a migration imports library code ({name})")
                )
    return found


#: Underscore names that are public API: SQLAlchemy's ``Row`` and the named-tuple protocol.
PUBLIC_UNDERSCORED: Final = frozenset(
    {"_mapping", "_asdict", "_fields", "_field_defaults", "_make", "_replace", "_t", "_tuple"}
)


def third_party_violations(index: Index, source: str, path: str) -> list[Violation]:
    """Reads of another distribution's private attributes outside a ``*_compat.py`` shim
    (``index``: what sessionrepo and bench define, so that their own are not counted)."""
    if path.endswith("_compat.py"):
        return []
    tree = ast.parse(source, path)
    ours = set().union(*index.privates.values(), _defined_privates(tree), PUBLIC_UNDERSCORED)
    found: list[Violation] = []
    for node in ast.walk(tree):
        name: str | None = None
        receiver: ast.expr | None = None
        if isinstance(node, ast.Attribute):
            name, receiver = node.attr, node.value
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            name, receiver = node.args[1].value, node.args[0]
        if name is None or not is_private(name) or name in ours:
            continue
        if isinstance(receiver, ast.Name) and receiver.id in ("self", "cls"):
            continue
        found.append(
            Violation(
                path,
                getattr(node, "lineno", 0),
                f"uses {name}, a third party's private, outside a *_compat.py shim",
            )
        )
    return found


def _checked_files(root: Path) -> Iterator[Path]:
    for package in CHECKED:
        folder = next(f for f, p in SOURCES.items() if package.startswith(p))
        yield from sorted((root / folder / package.split(".")[1]).rglob("*.py"))
    yield from sorted((root / OUTSIDE).rglob("*.py"))


def check(root: Path) -> list[Violation]:
    index = build_index(root)
    found: list[Violation] = []
    for path in _checked_files(root):
        module = module_name(root, path)
        assert module is not None
        found += public_api_violations(
            index,
            path.read_text(),
            str(path.relative_to(root)),
            module,
            is_package=path.name == "__init__.py",
        )
    for path in sorted((root / MIGRATIONS).glob("*.py")):
        found += migration_violations(path.read_text(), str(path.relative_to(root)))
    for folder in (*SOURCES, "migrations", OUTSIDE):
        for path in sorted((root / folder).rglob("*.py")):
            found += third_party_violations(index, path.read_text(), str(path.relative_to(root)))
    return sorted(found, key=lambda violation: (violation.path, violation.line))


#: Violations tolerated, as ``path: message`` (no line numbers: they move): none. The
#: twelve found when the rule came in (issue 23) are fixed; one that is gone while still
#: listed is an error too, so a list that ever grows again can only shrink.
KNOWN: Final = frozenset[str]()


def report(found: list[Violation], known: frozenset[str] = KNOWN) -> int:
    """Print the violations not in ``known`` and the ``known`` ones no longer found; the
    exit status: 1 if there are any."""
    keys = {f"{violation.path}: {violation.message}" for violation in found}
    new = [
        violation for violation in found if f"{violation.path}: {violation.message}" not in known
    ]
    gone = sorted(known - keys)
    for violation in new:
        print(violation)
    for key in gone:
        print(f"{key}: fixed, so delete it from KNOWN in tools/import_rules.py")
    if len(keys & known):
        print(f"({len(keys & known)} known violations left: KNOWN in tools/import_rules.py)")
    return 1 if new or gone else 0


def main(argv: Iterable[str] = ()) -> int:
    args = list(argv)
    root = Path(args[0]) if args else Path(__file__).resolve().parent.parent
    return report(check(root))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
