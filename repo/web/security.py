"""The console's guards: who may connect, what every response forbids the browser, and
the CSRF check of the write forms.

- **Bind**: loopback unless a token is set (:func:`check_bind`, called by ``serve``).
- **Host**: without a token, only a loopback ``Host`` is answered, so a web page that
  rebinds its own DNS name to 127.0.0.1 cannot read the console through the browser.
- **Token** (``SESSIONREPO_CONSOLE_TOKEN``): every request but the login form and the
  static files needs it, as ``Authorization: Bearer <token>`` or as the cookie the login
  form sets (an HMAC of the token, never the token itself); compared in constant time.
- **Headers**: a strict Content-Security-Policy (scripts and styles from the console's
  own static files only: nothing inline, no ``eval``; images from itself or ``data:``;
  no frames, no plugins, forms post only to itself), ``nosniff``, no referrer.
- **CSRF**: a write form carries a token derived from a secret made at start-up, and the
  request's ``Sec-Fetch-Site`` and ``Origin`` (or ``Referer``), when the browser sends
  them, must say it came from the console itself.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response

from sessionrepo.errors import InvalidArgument

TOKEN_ENV: Final = "SESSIONREPO_CONSOLE_TOKEN"
COOKIE: Final = "sessionrepo_console"
#: A token shorter than this is refused: it would be guessable over the network.
MIN_TOKEN_LENGTH: Final = 16

CONTENT_SECURITY_POLICY: Final = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
        "base-uri 'none'",
    ]
)
SECURITY_HEADERS: Final = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    # Nothing links elsewhere; same-origin keeps the Origin header on the console's own
    # form posts, which the CSRF check reads.
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cache-Control": "no-store",
}

#: Paths answered without the token: the login form and what it needs.
_OPEN_PATHS: Final = ("/login", "/static/")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 with or without brackets) is this
    machine's loopback."""
    host = host.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    """Refuse to listen beyond the loopback without a token, or with a weak one.

    Raises:
        InvalidArgument: the bind or the token is not allowed.
    """
    if token is not None and len(token) < MIN_TOKEN_LENGTH:
        raise InvalidArgument(
            TOKEN_ENV, f"must be at least {MIN_TOKEN_LENGTH} characters (use a random one)"
        )
    if token is None and not is_loopback(host):
        raise InvalidArgument(
            "host",
            f"binding {host} (beyond the loopback) needs a token: set {TOKEN_ENV}",
        )


@dataclass(frozen=True)
class Guard:
    """The console's access rules; ``token=None``: loopback clients only, no login."""

    token: str | None = None
    allow_writes: bool = False
    #: Made at start-up: CSRF tokens of an earlier run no longer work.
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)

    @property
    def cookie_value(self) -> str:
        assert self.token is not None
        return _mac(self.token.encode(), b"console-login")

    @property
    def csrf_token(self) -> str:
        return _mac(self.secret, b"csrf")

    def token_matches(self, candidate: str) -> bool:
        assert self.token is not None
        return hmac.compare_digest(candidate.encode(), self.token.encode())

    def authenticated(self, request: Request) -> bool:
        if self.token is None:
            return True
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and self.token_matches(value.strip()):
            return True
        cookie = request.cookies.get(COOKIE, "")
        return hmac.compare_digest(cookie.encode(), self.cookie_value.encode())

    def csrf_ok(self, request: Request, submitted: str | None) -> bool:
        """A write form's token, and the browser's word that it came from this console."""
        if submitted is None or not hmac.compare_digest(
            submitted.encode(), self.csrf_token.encode()
        ):
            return False
        site = request.headers.get("sec-fetch-site")
        if site is not None and site != "same-origin":
            return False
        origin = request.headers.get("origin") or request.headers.get("referer")
        if origin is None:
            return True  # not a browser, or one that sends neither: the token decides
        return urlsplit(origin).netloc == request.headers.get("host", "")

    async def middleware(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        response = await self._guarded(request, call_next)
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    async def _guarded(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        host = urlsplit("//" + request.headers.get("host", "")).hostname or ""
        if self.token is None and not is_loopback(host):
            return PlainTextResponse("this console answers loopback names only", 421)
        path = request.url.path
        if self.authenticated(request) or path.startswith(_OPEN_PATHS):
            return await call_next(request)
        if path.startswith("/api/") or path in ("/metrics", "/openapi.json"):
            return JSONResponse(
                {"error": "a token is needed (Authorization: Bearer ...)"},
                401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        return RedirectResponse("/login", 303)


def _mac(key: bytes, message: bytes) -> str:
    return hmac.new(key, message, hashlib.sha256).hexdigest()
