"""The distribution as a user installs it: a normal (non-editable) wheel.

The source folders the layout fixes (``repo/``, ``models/``, ``migrations/``) are installed
as one namespace, ``sessionrepo``; nothing named ``repo``, ``models`` or ``migrations`` may
land at the top of a user's site-packages, where it would shadow (or be shadowed by) the
user's own modules.
"""

from __future__ import annotations

import email.parser
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import tomllib
import zipfile
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.dependency_groups import resolve_dependency_groups
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
#: Source folder -> the package it is installed as.
SOURCES = {
    "repo": "sessionrepo",
    "models": "sessionrepo/models",
    "migrations": "sessionrepo/migrations",
}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Built from a copy, so that the build's own files (build/, *.egg-info) stay out of
    # the working tree.
    source = tmp_path_factory.mktemp("source")
    for name in ["pyproject.toml", "README.md"]:
        shutil.copy2(ROOT / name, source / name)
    for folder in SOURCES:
        shutil.copytree(
            ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__")
        )
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(source)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (built,) = out.glob("sessionrepo-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment with the wheel installed as a user installs it (not
    editable). Offline and quick: the wheel alone (``--no-deps``), by this interpreter's
    pip; the dependencies are this environment's, named by a ``.pth`` file written after
    the install (so pip never sees the development install). A ``.pth`` line is only a
    path: the development install's own ``.pth`` in that directory is not read, so
    ``sessionrepo`` can only come from the wheel."""
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    install = ["install", "--no-deps", "--no-index", "--no-compile", "-q", str(wheel)]
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), *install],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    [site] = (root / "lib").glob("python3.*/site-packages")
    ours = sysconfig.get_paths()
    (site / "_dependencies.pth").write_text(
        "".join(f"{path}\n" for path in dict.fromkeys([ours["purelib"], ours["platlib"]]))
    )
    return root


def _source_files() -> set[str]:
    shipped = set()
    for folder, package in SOURCES.items():
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in {".py", ".mako"} or path.name == "py.typed":
                shipped.add(f"{package}/{path.relative_to(ROOT / folder).as_posix()}")
    return shipped


def test_the_wheel_holds_one_namespace_and_every_source_file(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/", 1)[0] for name in names}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"sessionrepo"}
    assert _source_files() <= set(names), sorted(_source_files() - set(names))


def test_a_gateway_with_its_own_models_and_repo_uses_sessionrepo(
    venv: Path, tmp_path: Path
) -> None:
    """The trap of top-level ``models`` and ``repo`` packages: a gateway's own
    ``models.py`` shadowed them (ImportError inside the async API). Installed as
    ``sessionrepo``, both live, and the gateway appends from its own directory."""
    gateway = tmp_path / "gateway"
    (gateway / "repo").mkdir(parents=True)
    (gateway / "models.py").write_text("GATEWAY_MODEL = 'mine'\n")
    (gateway / "repo" / "__init__.py").write_text("GATEWAY_REPO = 'mine'\n")
    (gateway / "app.py").write_text(
        textwrap.dedent(
            """
            import asyncio
            import sys

            import models
            import repo
            import sessionrepo
            from sessionrepo import Message, TranscriptWriter, open_async_repository
            from sessionrepo import open_repository
            from sessionrepo.models import Session

            assert (models.GATEWAY_MODEL, repo.GATEWAY_REPO) == ("mine", "mine")
            assert sessionrepo.__file__.startswith(sys.argv[1]), sessionrepo.__file__
            message = {"role": "user", "content": "hello"}  # stamped by the first write
            with open_repository("sqlite:///store.db") as store:
                with TranscriptWriter(store, outbox_url="sqlite:///outbox.db") as writer:
                    assert writer.write("s1", [message]).status == "stored"
                    assert writer.write("s1", [message]).inserted == []
                stored = store.load_transcript("s1")
                assert [m.content for m in stored] == ["hello"]
                assert isinstance(store.get_session("s1"), Session)
                assert isinstance(Message.from_openai(message), Message)

            async def main() -> None:
                async with await open_async_repository("sqlite:///store.db") as store:
                    assert len(await store.load_transcript("s1")) == 1

            asyncio.run(main())
            print("ok")
            """
        )
    )
    [site] = (venv / "lib").glob("python3.*/site-packages")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "SESSIONREPO_"))}
    done = subprocess.run(
        [str(venv / "bin" / "python"), "app.py", str(site / "sessionrepo")],
        cwd=gateway,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
    # The command is installed too, and reads the store the gateway wrote.
    listed = subprocess.run(
        [str(venv / "bin" / "sessionrepo"), "--url", "sqlite:///store.db", "sessions", "list"],
        cwd=gateway,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert listed.returncode == 0, listed.stderr
    assert "s1" in listed.stdout


#: Extra -> the framework distribution it installs (issue 17; the adapter modules import
#: only their own).
FRAMEWORKS = {"openai-agents": "openai-agents", "langchain": "langchain-core", "adk": "google-adk"}
#: Each adapter module, the framework module its guard imports first, and its extra.
GUARDS = [
    ("sessionrepo.integrations.openai_agents", "agents", "openai-agents"),
    ("sessionrepo.integrations.langchain", "langchain_core", "langchain"),
    ("sessionrepo.integrations.adk", "google.adk", "adk"),
]


def _requirements(wheel: Path) -> tuple[list[str], list[Requirement]]:
    with zipfile.ZipFile(wheel) as archive:
        [name] = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = email.parser.BytesParser().parsebytes(archive.read(name))
    return metadata.get_all("Provides-Extra", []), [
        Requirement(line) for line in metadata.get_all("Requires-Dist", [])
    ]


def _extra(requirements: list[Requirement], extra: str) -> list[Requirement]:
    """What ``pip install 'sessionrepo[extra]'`` adds to the core (``""``: the core)."""
    if not extra:
        return [r for r in requirements if r.marker is None]
    return [r for r in requirements if r.marker is not None and r.marker.evaluate({"extra": extra})]


def _names(requirements: list[Requirement]) -> set[str]:
    return {canonicalize_name(r.name) for r in requirements}


#: The extras a user may ask for; the developers' dependencies (test, dev, bench) are PEP 735
#: groups in pyproject.toml, which a wheel never publishes.
USER_EXTRAS = {"web", "metrics", "tracing", "semantic", "sqlite-vec", *FRAMEWORKS}


def test_the_wheel_publishes_only_the_user_facing_extras(wheel: Path) -> None:
    """``sessionrepo[test]`` and the like would be an installable promise to users; the
    tools only the developers run (pytest, mypy, the bench's peers) stay out of the
    metadata altogether."""
    extras, requirements = _requirements(wheel)
    assert set(extras) == USER_EXTRAS
    tools = {"pytest", "hypothesis", "mypy", "ruff", "import-linter", "asyncpg", "py-spy"}
    assert not _names(requirements) & tools, sorted(_names(requirements) & tools)


def test_the_dependency_groups_hold_what_the_developers_run() -> None:
    """``make`` installs ``--group dev`` (the suite's, the bench's and the lint tools'
    dependencies): it resolves (no cycle, no unknown include), and this environment holds
    every requirement it names, in range."""
    groups = tomllib.loads((ROOT / "pyproject.toml").read_text())["dependency-groups"]
    assert {"test", "bench", "dev"} <= set(groups)
    required = [Requirement(line) for line in resolve_dependency_groups(groups, "dev")]
    assert {"pytest", "asyncpg", "mypy"} <= _names(required)
    for requirement in required:
        assert requirement.specifier.contains(version(requirement.name)), requirement


def test_each_framework_comes_with_its_extra_and_the_core_brings_none(wheel: Path) -> None:
    """``pip install sessionrepo`` installs no framework; ``sessionrepo[adk]`` (and the
    others) installs its framework, in a range that holds the version the tests run."""
    extras, requirements = _requirements(wheel)
    assert set(FRAMEWORKS) <= set(extras)
    core = _names(_extra(requirements, ""))
    assert "sqlalchemy" in core
    frameworks = {"openai", "openai-agents", "google-adk", "google-genai"}
    assert not {n for n in core if n in frameworks or n.startswith("langchain")}, core
    for extra, framework in FRAMEWORKS.items():
        [requirement] = _extra(requirements, extra)
        assert canonicalize_name(requirement.name) == framework, (extra, requirement)
        assert requirement.specifier.contains(version(framework)), (extra, requirement)


def test_an_adapter_without_its_framework_names_the_extra_to_install(venv: Path) -> None:
    """Imported without its framework (blocked here, as if the extra were not
    installed), an adapter module raises an ImportError that says what to install,
    chained to the original one, instead of a bare "No module named 'agents'"."""
    script = textwrap.dedent(
        """
        import importlib
        import sys

        module, framework = sys.argv[1:]
        sys.modules[framework] = None  # what an environment without the extra looks like
        try:
            importlib.import_module(module)
        except ImportError as exc:
            assert isinstance(exc.__cause__, ModuleNotFoundError), repr(exc.__cause__)
            print(exc)
        else:
            raise SystemExit("imported without its framework")
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "SESSIONREPO_"))}
    for module, framework, extra in GUARDS:
        done = subprocess.run(
            [str(venv / "bin" / "python"), "-c", script, module, framework],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip().endswith(f"pip install 'sessionrepo[{extra}]'"), done.stdout
