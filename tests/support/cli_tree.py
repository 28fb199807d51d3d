"""The ``sessionrepo`` command tree, walked: the tests that must cover every command
(help, secrets, ``--json``, ``--url`` placement) enumerate it from here, so a new
command is covered, or fails, without anyone listing it."""

from __future__ import annotations

from collections.abc import Iterator

import click

from sessionrepo.cli import main


def _walk(command: click.Command, path: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    yield path
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from _walk(sub, (*path, name))


#: Every command's path from the top (``()`` is ``sessionrepo`` itself), groups included.
COMMAND_PATHS: list[tuple[str, ...]] = list(_walk(main, ()))


def command_at(path: tuple[str, ...]) -> click.Command:
    """The command ``sessionrepo <path...>`` runs."""
    command: click.Command = main
    for name in path:
        assert isinstance(command, click.Group)
        command = command.commands[name]
    return command


#: The commands that do something (not groups): what a user runs.
LEAVES: list[tuple[str, ...]] = [
    path for path in COMMAND_PATHS if not isinstance(command_at(path), click.Group)
]
