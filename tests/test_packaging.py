"""The distribution as a user installs it: a normal (non-editable) wheel.

The source folders the layout fixes (``repo/``, ``models/``, ``migrations/``) are installed
as one namespace, ``sessionrepo``; nothing named ``repo``, ``models`` or ``migrations`` may
land at the top of a user's site-packages, where it would shadow (or be shadowed by) the
user's own modules.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

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
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "-q",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    return target


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


def test_a_gateway_with_its_own_models_module_uses_sessionrepo(
    installed: Path, tmp_path: Path
) -> None:
    """The trap of a top-level ``models`` package: a gateway's own ``models.py`` shadowed
    it (ImportError inside the async API). Installed as ``sessionrepo.models``, both live."""
    gateway = tmp_path / "gateway"
    gateway.mkdir()
    (gateway / "models.py").write_text("GATEWAY_MODEL = 'mine'\n")
    (gateway / "app.py").write_text(
        textwrap.dedent(
            """
            import asyncio
            import sys

            import models
            import sessionrepo
            from sessionrepo import Message, TranscriptWriter, open_async_repository
            from sessionrepo import ensure_key, open_repository
            from sessionrepo.models import Session

            assert models.GATEWAY_MODEL == "mine"
            assert sessionrepo.__file__.startswith(sys.argv[1]), sessionrepo.__file__
            message = {"role": "user", "content": "hello"}
            ensure_key(message)  # the key it keeps across every flush
            with open_repository("sqlite:///store.db") as repo:
                with TranscriptWriter(repo, outbox_url="sqlite:///outbox.db") as writer:
                    assert writer.write("s1", [message]).status == "stored"
                    assert writer.write("s1", [message]).status == "stored"
                stored = repo.load_transcript("s1")
                assert [m.content for m in stored] == ["hello"]
                assert isinstance(repo.get_session("s1"), Session)
                assert isinstance(Message.from_openai(message), Message)

            async def main() -> None:
                async with await open_async_repository("sqlite:///store.db") as repo:
                    assert len(await repo.load_transcript("s1")) == 1

            asyncio.run(main())
            print("ok")
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": str(installed)}
    done = subprocess.run(
        [sys.executable, "app.py", str(installed)],
        cwd=gateway,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
