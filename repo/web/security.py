"""The console's guards: who may connect, what every response forbids the browser, and
the CSRF check of the write forms.

- **Bind**: loopback unless a token is set (:func:`check_bind`, called by ``serve``).
- **Host**: without a token, only a loopback ``Host`` is answered, so a web page that
  rebinds its own DNS name to 127.0.0.1 cannot read the console through the browser.
- **Token** (``SESSIONREPO_CONSOLE_TOKEN``, strong enough: :func:`check_token`): every
  request but the sign-in form and the static files needs it, as ``Authorization: Bearer
  <token>`` or as the cookie the sign-in form sets: a fresh random value per sign-in,
  known only to this run (a restart signs everyone out), valid for a bounded lifetime
  (:data:`SESSION_LIFETIME` by default) and revoked by signing out. Compared in constant
  time.
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
import math
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import urlencode, urlsplit

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response

from sessionrepo.errors import InvalidArgument

TOKEN_ENV: Final = "SESSIONREPO_CONSOLE_TOKEN"
COOKIE: Final = "sessionrepo_console"
#: A token shorter than this, or with less randomness than :data:`MIN_TOKEN_BITS` in
#: its characters, is refused: it would be guessable over the network.
MIN_TOKEN_LENGTH: Final = 24
MIN_TOKEN_BITS: Final = 100
#: How to make a token that passes.
MAKE_TOKEN: Final = "python -c 'import secrets; print(secrets.token_urlsafe(32))'"
#: Seconds a sign-in lasts unless ``serve --session-hours`` says otherwise.
SESSION_LIFETIME: Final = 12 * 3600.0
#: Signed-in browsers remembered at once; past it the oldest sign-in is forgotten.
MAX_SESSIONS: Final = 1000

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


def token_bits(token: str) -> float:
    """An estimate of the randomness in ``token``: its length times the Shannon entropy
    of its characters (``aaaa…``: 0; 43 characters of ``token_urlsafe``: about 220)."""
    counts = Counter(token)
    return -sum(n * math.log2(n / len(token)) for n in counts.values())


def check_token(token: str) -> None:
    """Refuse a console token that could be guessed.

    Raises:
        InvalidArgument: it is too short, holds spaces or control characters, or has too
            little randomness; the message says what is needed and how to make one (it
            never quotes the token).
    """
    problem = None
    if len(token) < MIN_TOKEN_LENGTH:
        problem = f"it has {len(token)} characters"
    elif not token.isprintable() or any(c.isspace() for c in token):
        problem = "it holds spaces or control characters"
    elif token_bits(token) < MIN_TOKEN_BITS:
        problem = f"its characters repeat too much (about {token_bits(token):.0f} bits)"
    if problem is not None:
        raise InvalidArgument(
            TOKEN_ENV,
            f"too weak: {problem}; a token needs at least {MIN_TOKEN_LENGTH} characters, "
            f"no spaces, and about {MIN_TOKEN_BITS} bits of randomness. Make one with: "
            f"{MAKE_TOKEN}",
        )


def check_bind(host: str, token: str | None) -> None:
    """Refuse to listen beyond the loopback without a token, or with a weak one.

    Raises:
        InvalidArgument: the bind or the token is not allowed.
    """
    if token is not None:
        check_token(token)
    if token is None and not is_loopback(host):
        raise InvalidArgument(
            "host",
            f"binding {host} (beyond the loopback) needs a token: set {TOKEN_ENV} "
            f"(make one with: {MAKE_TOKEN})",
        )


def local_path(target: str | None) -> str:
    """``target`` when it is a path on this console (where a sign-in may send the
    browser back to), else ``/``: never another site (``//host``, ``/\\host``, a
    scheme), so the sign-in form is no open redirect."""
    if not target or not target.startswith("/") or target.startswith(("//", "/\\")):
        return "/"
    if not target.isprintable() or any(c.isspace() for c in target):
        return "/"
    parts = urlsplit(target)
    if parts.scheme or parts.netloc:
        return "/"
    return target


@dataclass(frozen=True)
class Guard:
    """The console's access rules; ``token=None``: loopback clients only, no login."""

    token: str | None = None
    allow_writes: bool = False
    #: Seconds a sign-in lasts.
    session_lifetime: float = SESSION_LIFETIME
    #: Made at start-up: CSRF tokens of an earlier run no longer work.
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)
    #: The signed-in browsers: the SHA-256 of each cookie (never the cookie itself) and
    #: when it expires (``time.monotonic()``). In memory only: a restart signs out all.
    sessions: dict[str, float] = field(default_factory=dict, repr=False)

    @property
    def csrf_token(self) -> str:
        return _mac(self.secret, b"csrf")

    def token_matches(self, candidate: str) -> bool:
        assert self.token is not None
        return hmac.compare_digest(candidate.encode(), self.token.encode())

    def sign_in(self) -> str:
        """A new sign-in: the cookie value that proves it, valid for the lifetime."""
        now = time.monotonic()
        for key, expires in list(self.sessions.items()):
            if expires <= now:
                del self.sessions[key]
        while len(self.sessions) >= MAX_SESSIONS:
            del self.sessions[min(self.sessions, key=self.sessions.__getitem__)]
        cookie = secrets.token_urlsafe(32)
        self.sessions[_digest(cookie)] = now + self.session_lifetime
        return cookie

    def sign_out(self, cookie: str | None) -> None:
        """Revoke the sign-in ``cookie`` proves (nothing when it proves none)."""
        if cookie:
            self.sessions.pop(_digest(cookie), None)

    def signed_in(self, cookie: str | None) -> bool:
        if not cookie:
            return False
        # The digest is the dict's key: looking it up reveals nothing about other cookies.
        expires = self.sessions.get(_digest(cookie))
        if expires is None:
            return False
        if expires <= time.monotonic():
            self.sign_out(cookie)
            return False
        return True

    def authenticated(self, request: Request) -> bool:
        if self.token is None:
            return True
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and self.token_matches(value.strip()):
            return True
        return self.signed_in(request.cookies.get(COOKIE))

    def csrf_problem(self, request: Request, submitted: str | None) -> str | None:
        """Why a write form is refused (``None``: it is not): its token must be this
        run's, and the browser must say it came from this console itself. The answer
        says what to do about it."""
        if submitted is None or not hmac.compare_digest(
            submitted.encode(), self.csrf_token.encode()
        ):
            return (
                "this form does not carry this run's form token: the console restarted "
                "since the page was loaded (or the form was made elsewhere). Load the page "
                "again and submit the form from there"
            )
        site = request.headers.get("sec-fetch-site")
        origin = request.headers.get("origin") or request.headers.get("referer")
        if site is not None and site != "same-origin":
            why = f"Sec-Fetch-Site: {site}"
        elif origin is not None and urlsplit(origin).netloc != request.headers.get("host", ""):
            why = "its Origin is not the address this request was sent to"
        else:
            return None
        return (
            f"the browser says this form was sent from another site ({why}). Submit it "
            "from the console's own page, at the address the console is opened at; behind "
            "a reverse proxy, have the proxy pass the Host header through unchanged"
        )

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
            return PlainTextResponse(MISDIRECTED, 421)
        path = request.url.path
        if self.authenticated(request) or path.startswith(_OPEN_PATHS):
            return await call_next(request)
        if path.startswith("/api/") or path in ("/metrics", "/openapi.json"):
            return JSONResponse(
                {"error": "a token is needed (Authorization: Bearer ...)"},
                401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        asked = path + ("?" + request.url.query if request.url.query else "")
        target = "/login" if asked == "/" else "/login?" + urlencode({"next": asked})
        return RedirectResponse(target, 303)


#: The 421 answer: what is wrong and the two ways to fix it.
MISDIRECTED: Final = (
    "This console answers loopback host names only (localhost, 127.0.0.1, [::1]), and this "
    "request's Host header names another: a page that rebinds its DNS name to this machine "
    "is refused this way. Open the console as http://127.0.0.1:<port>/ (or through an SSH "
    "tunnel), or, to serve it under other names, start it with "
    f"{TOKEN_ENV} set (and --host), so that every client must sign in.\n"
)


def _digest(cookie: str) -> str:
    return hashlib.sha256(cookie.encode()).hexdigest()


def _mac(key: bytes, message: bytes) -> str:
    return hmac.new(key, message, hashlib.sha256).hexdigest()
