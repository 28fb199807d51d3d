"""The ``sessionrepo`` command: a thin shell over the library (parse, call, print).

The top-level group and the list of commands are in ``root`` (its ``--url`` reaches
every command as the click context's object). Each command, or family of commands, lives
in its own module: ``sessions`` (list, show, end), ``search`` (search, reindex),
``outbox`` (status, drain, retry-dead), ``ops`` (migrate, doctor, export, import, prune),
``hermes`` (import-hermes) and ``demo``; what they share is in ``_common``.

Library errors (:class:`sessionrepo.errors.RepoError`) become one clean line on stderr and
exit status 1. Database URLs are only ever shown with the password masked. The outbox
commands add exit statuses a monitoring script can act on (3, 4: see
``sessionrepo outbox --help``).
"""

from sessionrepo.cli.root import main

__all__ = ["main"]
