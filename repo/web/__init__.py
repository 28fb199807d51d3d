"""The operator console (``sessionrepo serve``, the ``[web]`` extra): sessions,
transcripts, search and outbox health as server-rendered pages and a JSON API.

:func:`create_app` makes the ASGI application over a :class:`SessionRepository`;
:mod:`sessionrepo.web.views` builds what each page shows, :mod:`sessionrepo.web.security`
holds the access rules (loopback or token, CSRF, the Content-Security-Policy).
"""

from sessionrepo.web.app import create_app
from sessionrepo.web.security import TOKEN_ENV, check_bind

__all__ = ["TOKEN_ENV", "check_bind", "create_app"]
