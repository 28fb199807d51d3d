"""sessionrepo.integrations.adk_compat: the installed Google ADK has the private revision
marker the shim reads and writes, in the version range pyproject.toml allows, and a
session's marker round-trips through it."""

from __future__ import annotations

import tomllib
from importlib.metadata import version
from pathlib import Path

from google.adk.sessions import Session
from packaging.requirements import Requirement

from sessionrepo.integrations.adk_compat import (
    has_marker,
    set_update_marker,
    update_marker,
)

ROOT = Path(__file__).resolve().parents[2]


def test_the_installed_adk_session_declares_the_marker() -> None:
    assert has_marker()


def test_a_class_without_the_marker_is_told_apart() -> None:
    class Other(Session):  # a Session whose private attributes lack the marker
        pass

    Other.__private_attributes__ = {}
    assert not has_marker(Other)


def test_the_bound_holds_the_installed_version() -> None:
    """The range in pyproject is the one the shim was checked on."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    [bound] = [
        Requirement(line)
        for line in project["optional-dependencies"]["adk"]
        if Requirement(line).name == "google-adk"
    ]
    assert bound.specifier.contains(version("google-adk")), (bound, version("google-adk"))
    assert any(spec.operator == "<" for spec in bound.specifier), bound  # an upper bound


def test_the_marker_round_trips() -> None:
    session = Session(id="s", app_name="app", user_id="u")
    assert update_marker(session) is None
    set_update_marker(session, "7")
    assert update_marker(session) == "7"
    set_update_marker(session, None)
    assert update_marker(session) is None
