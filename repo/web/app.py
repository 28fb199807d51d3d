"""The console's ASGI application: the pages, the JSON API (described at
``/openapi.json``), the write forms and ``/metrics``.

Every page reads through the repository's public calls (see :mod:`sessionrepo.web.views`);
nothing here writes unless the console was made with ``allow_writes=True``, and then only
through the POST forms, each checked against CSRF.
"""

from __future__ import annotations

import contextlib
import io
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Final, Literal
from urllib.parse import parse_qs, urlencode

import jinja2
from fastapi import FastAPI, Query
from fastapi.exceptions import RequestValidationError
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from sessionrepo import observability
from sessionrepo.errors import (
    BackendUnavailable,
    InvalidArgument,
    InvalidMessage,
    NotFound,
    RepoError,
    SearchIndexUnavailable,
)
from sessionrepo.models import SearchHit, Session, SessionSummary, StoredMessage
from sessionrepo.models.outbox import OutboxStatus
from sessionrepo.ops import DoctorReport, Selection, export_sessions, run_doctor
from sessionrepo.outbox.table import Outbox
from sessionrepo.search.embedders import Embedder
from sessionrepo.search.query import parse_query
from sessionrepo.store.repository import SessionRepository
from sessionrepo.web import views
from sessionrepo.web.reindex import BackgroundReindex, ReindexProgress
from sessionrepo.web.security import COOKIE, SESSION_LIFETIME, Guard, local_path
from sessionrepo.web.tenants import Scope, Tenants

log = logging.getLogger("sessionrepo.web")

_HERE: Final = Path(__file__).resolve().parent
MAX_SEQ: Final = 2**63 - 1
#: The pages that list (sessions, hits, totals, rows): the tenant picker keeps one as is.
_LISTING_PAGES: Final = frozenset({"/", "/search", "/insights", "/health", "/audit"})
#: What a write form's redirect says it did (a fixed text per key: nothing echoed).
_DONE: Final = {
    "ended": "The session was ended.",
    "not-ended": "The session was already ended.",
    "reopened": "The session was reopened.",
    "not-reopened": "The session was already open.",
    "retried": "Dead outbox rows were put back in line.",
    "reindex-started": "The search index is being rebuilt: its progress is below.",
    "reindex-running": "A rebuild of the search index is running already: its progress is below.",
    "erased": "The session was erased, with every copy the store held (its audit row is below).",
}


# -- the JSON API's answers ---------------------------------------------------------------


class SessionList(BaseModel):
    model_config = ConfigDict(frozen=True)

    sessions: list[SessionSummary]
    #: ``cursor=`` of the next page; ``None`` on the last one.
    next_cursor: str | None


class SessionDetail(BaseModel):
    model_config = ConfigDict(frozen=True)

    session: Session
    #: Ids of the session and its ancestors, oldest first.
    chain: list[str]
    #: Id of the live end of its continuation chain.
    tip: str


class MessagePage(BaseModel):
    model_config = ConfigDict(frozen=True)

    messages: list[StoredMessage]
    #: ``after=`` of the next page; ``before=`` of the previous one.
    next_after: int | None
    previous_before: int | None


class SearchResults(BaseModel):
    model_config = ConfigDict(frozen=True)

    hits: list[SearchHit]
    #: ``cursor=`` of the next page; ``None`` when there are no more hits.
    next_cursor: int | None


class Health(BaseModel):
    model_config = ConfigDict(frozen=True)

    doctor: DoctorReport
    #: Why the primary database cannot be reached now (``None``: it answers).
    primary_error: str | None
    outbox: OutboxStatus | None
    outbox_error: str | None
    search_backlog: int | None
    search_state: str | None
    search_reason: str | None
    search_error: str | None
    #: The console's running or last "Rebuild the index" (``None``: none since start).
    reindex: ReindexProgress | None


class ErrorAnswer(BaseModel):
    error: str


_ERRORS: Final[dict[int | str, dict[str, Any]]] = {
    400: {"model": ErrorAnswer, "description": "an argument is invalid"},
    404: {"model": ErrorAnswer, "description": "no such session"},
    503: {"model": ErrorAnswer, "description": "the database cannot answer now"},
}


def _json(model: BaseModel) -> Response:
    # By alias: the wire names the schema at /openapi.json describes.
    return Response(model.model_dump_json(by_alias=True), media_type="application/json")


# -- arguments ----------------------------------------------------------------------------

SessionId = Annotated[str, Query(min_length=1, max_length=255, description="a session id")]
Seq = Annotated[int | None, Query(ge=0, le=MAX_SEQ)]
Text = Annotated[str | None, Query(max_length=1024)]
Since = Annotated[
    str | None, Query(max_length=64, description="ISO date or time (UTC when no zone)")
]
Tenant = Annotated[
    str | None,
    Query(
        max_length=63,
        description="the tenant whose conversations to read (a console that sees several: "
        "the operator's); a console of one tenant takes none, or its own",
    ),
]


def _optional(value: str | None) -> str | None:
    """A blank form field is no filter."""
    return value if value else None


def _moment(value: str | None, name: str) -> datetime | None:
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidArgument(
            name, "not an ISO date or time (2026-12-01, 2026-12-01T10:00Z)"
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _status(value: str | None) -> Literal["open", "ended"] | None:
    if value in (None, ""):
        return None
    if value == "open":
        return "open"
    if value == "ended":
        return "ended"
    raise InvalidArgument("status", "must be open or ended")


def _order(value: str | None) -> Literal["rank", "newest"]:
    if value in (None, "", "rank"):
        return "rank"
    if value == "newest":
        return "newest"
    raise InvalidArgument("order", "must be rank or newest")


# -- the application ----------------------------------------------------------------------


class Console:
    """What the routes share: the store, the outbox, the guard and the templates."""

    def __init__(
        self,
        repository: SessionRepository,
        *,
        url: str | None,
        outbox: Outbox,
        outbox_url: str | None,
        guard: Guard,
        embedder: Embedder | bool | None = None,
    ) -> None:
        self.repository = repository
        self.url = url
        self.outbox = outbox
        self.outbox_url = outbox_url
        self.guard = guard
        self.tenants = Tenants(repository, embedder)
        self.reindexing = BackgroundReindex(repository)
        self.templates = jinja2.Environment(
            loader=jinja2.FileSystemLoader(_HERE / "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        self.templates.filters["when"] = _when
        self.templates.filters["age"] = _age
        self.templates.filters["tenanted"] = _tenanted
        self.templates.globals.update(
            allow_writes=guard.allow_writes,
            csrf_token=guard.csrf_token,
            login=guard.token is not None,
            database=repository.display_url,
            backend=repository.backend,
        )

    def page(
        self, name: str, status: int = 200, scope: Scope | None = None, **context: Any
    ) -> HTMLResponse:
        """``name`` rendered; with ``scope``, its tenant kept in the page's links and
        forms (the ``tenanted`` filter, ``_tenant.html``) and its picker shown."""
        html = self.templates.get_template(name).render(
            tenant=None if scope is None else scope.tenant,
            tenants=None if scope is None else scope.choices,
            **context,
        )
        return HTMLResponse(html, status)

    def scope(self, tenant: str | None) -> Scope:
        """What a request with ``tenant=`` reads (see :mod:`sessionrepo.web.tenants`)."""
        return self.tenants.scope(_optional(tenant))

    def read(self, tenant: str | None) -> tuple[SessionRepository, Scope]:
        """The repository a JSON call or a form reads or writes, and its scope.

        Raises:
            InvalidArgument: the operator's console and no tenant named.
        """
        scope = self.scope(tenant)
        if scope.repository is None:
            raise InvalidArgument(
                "tenant", "this console sees several tenants: name one (tenant=NAME)"
            )
        return scope.repository, scope

    def choose(self, request: Request, scope: Scope) -> HTMLResponse:
        """The operator's page before a tenant is chosen: the tenants, their session
        counts, each a link to the page asked for, as that tenant."""
        path = request.url.path
        # A listing asked for is shown as the tenant, its filters kept; a session's page
        # is not (its id is per tenant): the tenant's sessions instead.
        kept = [] if path not in _LISTING_PAGES else request.query_params.multi_items()
        target = path if path in _LISTING_PAGES else "/"

        def link(name: str) -> str:
            return (
                target + "?" + urlencode([*(i for i in kept if i[0] != "tenant"), ("tenant", name)])
            )

        return self.page("tenants.html", scope=scope, listed=self.tenants.listed(), link=link)

    def health(self) -> Health:
        doctor = run_doctor(self.url, outbox_url=self.outbox_url)
        outbox: OutboxStatus | None = None
        outbox_error = None
        try:
            outbox = self.outbox.status()
        except RepoError as exc:
            outbox_error = views.one_line(exc)
        backlog, state, reason, search_error = views.search_health(self.repository)
        connection = next((c for c in doctor.checks if c.name == "connection"), None)
        return Health(
            doctor=doctor,
            primary_error=(
                connection.detail
                if connection is not None and connection.status == "fail"
                else None
            ),
            outbox=outbox,
            outbox_error=outbox_error,
            search_backlog=backlog,
            search_state=state,
            search_reason=reason,
            search_error=search_error,
            reindex=self.reindexing.progress,
        )

    def export(self, repository: SessionRepository, session_id: str) -> bytes:
        out = io.BytesIO()
        export_sessions(repository, out, Selection(session_ids=(session_id,)))
        return out.getvalue()


def create_app(
    repository: SessionRepository,
    *,
    url: str | None = None,
    outbox_url: str | None = None,
    outbox: Outbox | None = None,
    token: str | None = None,
    allow_writes: bool = False,
    metrics: bool = False,
    session_lifetime: float = SESSION_LIFETIME,
    embedder: Embedder | bool | None = None,
) -> FastAPI:
    """The console over ``repository`` (served by ``sessionrepo serve``).

    Args:
        url: the repository's database URL, for the health page's ``doctor`` checks.
        outbox_url: where the gateways park (``None``: the primary's own outbox).
        outbox: that outbox, opened (default: the primary's).
        token: required of every client when set (see :mod:`sessionrepo.web.security`).
        allow_writes: offer the write forms (end, reopen, retry-dead, reindex).
        metrics: record the library's metrics (:func:`sessionrepo.observability.enable_metrics`,
            prometheus-client's global registry unless one was enabled before) and export
            them, with this store's and outbox's gauges, at ``/metrics``.
        session_lifetime: seconds a sign-in lasts (with ``token``).
        embedder: what the tenants' repositories of an operator's console embed semantic
            searches with (see :mod:`sessionrepo.web.tenants`): ``None`` (the default:
            one default embedder, the ``semantic`` extra's, shared by them all),
            ``False`` (none), or an :class:`~sessionrepo.search.embedders.Embedder`.
    """
    console = Console(
        repository,
        url=url,
        outbox=outbox if outbox is not None else Outbox.of(repository),
        outbox_url=outbox_url,
        guard=Guard(token=token, allow_writes=allow_writes, session_lifetime=session_lifetime),
        embedder=embedder,
    )
    watching: list[observability.Watch] = []

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if metrics:
            registry = observability.metrics_registry() or observability.enable_metrics()
            watching.append(observability.watch(repository, console.outbox, registry=registry))
        try:
            yield
        finally:
            for watched in watching:
                watched.close()
            console.tenants.close()

    app = FastAPI(
        lifespan=lifespan,
        title="sessionrepo console",
        summary="Sessions, transcripts, search and outbox health of a sessionrepo store.",
        version="1",
        docs_url=None,  # the interactive docs load scripts from elsewhere: not under our CSP
        redoc_url=None,
    )
    app.state.console = console
    app.middleware("http")(console.guard.middleware)
    app.middleware("http")(_server_timing)
    app.mount("/static", StaticFiles(directory=_HERE / "static"), name="static")
    _error_handlers(app, console)
    _pages(app, console)
    _api(app, console)
    _writes(app, console)
    return app


async def _server_timing(
    request: Request, call_next: Callable[[Request], Awaitable[Response]]
) -> Response:
    started = time.perf_counter()
    response = await call_next(request)
    elapsed = (time.perf_counter() - started) * 1000
    response.headers["Server-Timing"] = f"app;dur={elapsed:.2f}"
    return response


def _error_handlers(app: FastAPI, console: Console) -> None:
    def answer(request: Request, status: int, message: str) -> Response:
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": message}, status)
        return console.page("error.html", status, message=message, back=None)

    async def repo_error(request: Request, exc: Exception) -> Response:
        status = 500
        if isinstance(exc, NotFound):
            status = 404
        elif isinstance(exc, InvalidArgument | InvalidMessage | TypeError):
            status = 400
        elif isinstance(exc, BackendUnavailable | SearchIndexUnavailable):
            status = 503
        if isinstance(exc, BackendUnavailable) and not request.url.path.startswith("/api/"):
            # Down is a state the operator came to see, not a failure of the page.
            return console.page("down.html", 503, message=views.one_line(exc))
        return answer(request, status, views.one_line(exc))

    async def invalid_request(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        problems = [
            f"{'.'.join(str(p) for p in error.get('loc', ())[1:])}: {error.get('msg', '')}"
            for error in exc.errors()
        ]
        return answer(request, 400, views.visible("; ".join(problems)))

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        return answer(request, exc.status_code, str(exc.detail))

    async def unexpected(request: Request, exc: Exception) -> Response:
        log.exception("console: %s %s failed", request.method, request.url.path)
        return answer(request, 500, "internal error (the server's log has the details)")

    app.add_exception_handler(RepoError, repo_error)
    app.add_exception_handler(RequestValidationError, invalid_request)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, unexpected)


def _pages(app: FastAPI, console: Console) -> None:
    @app.get("/", include_in_schema=False)
    def sessions_page(
        request: Request,
        *,
        tenant: Tenant = None,
        source: Text = None,
        user: Text = None,
        status: Text = None,
        since: Since = None,
        cursor: Text = None,
    ) -> Response:
        filters = {
            "source": _optional(source),
            "user": _optional(user),
            "status": _optional(status),
            "since": _optional(since),
        }
        scope = console.scope(tenant)
        if scope.repository is None:
            return console.choose(request, scope)
        page = views.listing_page(
            scope.repository,
            source=filters["source"],
            user_id=filters["user"],
            status=_status(status),
            since=_moment(since, "since"),
            cursor=_optional(cursor),
        )
        kept = {k: v for k, v in filters.items() if v}
        next_link = None
        if page.next_cursor is not None:
            next_link = "/?" + urlencode({**kept, "cursor": page.next_cursor})
        return console.page(
            "sessions.html",
            scope=scope,
            page=page,
            filters=filters,
            paged=cursor is not None,
            first_link="/?" + urlencode(kept),
            next_link=next_link,
            visible=views.visible,
        )

    @app.get("/session", include_in_schema=False)
    def session_page(
        request: Request,
        *,
        id: SessionId,
        after: Seq = None,
        before: Seq = None,
        done: Text = None,
        tenant: Tenant = None,
    ) -> Response:
        scope = console.scope(tenant)
        if scope.repository is None:
            return console.choose(request, scope)
        page = views.transcript_page(scope.repository, id, after=after, before=before)
        return console.page(
            "session.html",
            scope=scope,
            page=page,
            done=_DONE.get(done or ""),
            link=lambda **args: "/session?" + urlencode({"id": id, **args}),
            newest_link="/session?" + urlencode({"id": id, "before": MAX_SEQ}),
            whole_link=lambda seq: "/session/message?" + urlencode({"id": id, "seq": seq}),
            image_link=lambda seq, part: (
                "/session/image?" + urlencode({"id": id, "seq": seq, "part": part})
            ),
            session_link=lambda sid: "/session?" + urlencode({"id": sid}),
            export_link="/session/export?" + urlencode({"id": id}),
            visible=views.visible,
            as_json=views.as_json,
        )

    @app.get("/session/export", include_in_schema=False)
    def export_page(id: SessionId, tenant: Tenant = None) -> Response:
        return _export(console, console.read(tenant)[0], id)

    def one_message(tenant: str | None, session_id: str, seq: int) -> StoredMessage:
        repository, _ = console.read(tenant)
        found = repository.load_transcript(session_id, after_seq=seq - 1, limit=1)
        if not found or found[0].seq != seq:
            raise NotFound(f"no message #{seq} in session {session_id!r}")
        return found[0]

    @app.get("/session/message", include_in_schema=False)
    def whole_message(
        id: SessionId, seq: Annotated[int, Query(ge=1, le=MAX_SEQ)], tenant: Tenant = None
    ) -> Response:
        """One message whole, as plain text: what the transcript page cut."""
        text = views.whole_text(one_message(tenant, id, seq))
        return Response(text, media_type="text/plain; charset=utf-8")

    @app.get("/session/image", include_in_schema=False)
    def image(
        id: SessionId,
        seq: Annotated[int, Query(ge=1, le=MAX_SEQ)],
        part: Annotated[int, Query(ge=0, le=100_000)],
        tenant: Tenant = None,
    ) -> Response:
        """A message's raster image by itself (one too big to draw on the page)."""
        found = views.image_data(one_message(tenant, id, seq).content, part)
        if found is None:
            raise NotFound(f"no raster image in part {part} of message #{seq}")
        media, data = found
        return Response(data, media_type=media, headers={"Content-Disposition": "inline"})

    @app.get("/search", include_in_schema=False)
    def search_page(
        request: Request,
        *,
        tenant: Tenant = None,
        q: Annotated[str | None, Query(max_length=1024)] = None,
        source: Text = None,
        role: Text = None,
        user: Text = None,
        session: Text = None,
        since: Since = None,
        until: Since = None,
        order: Text = None,
        mode: Text = None,
        cursor: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
    ) -> Response:
        fields = {
            "q": q or "",
            "source": source or "",
            "role": role or "",
            "user": user or "",
            "session": session or "",
            "since": since or "",
            "until": until or "",
            "order": _order(order),
            "mode": mode if mode in ("semantic", "hybrid") else "keyword",
        }
        scope = console.scope(tenant)
        if scope.repository is None:
            return console.choose(request, scope)
        results = None
        next_link = previous_link = None
        if q and parse_query(q).positive:
            results = views.search_page(
                scope.repository,
                q,
                cursor=cursor,
                order=fields["order"],  # type: ignore[arg-type]
                mode=fields["mode"],  # type: ignore[arg-type]
                source=_optional(source),
                role=_optional(role),
                user_id=_optional(user),
                session_id=_optional(session),
                since=_moment(since, "since"),
                until=_moment(until, "until"),
            )
            kept = {k: v for k, v in fields.items() if v and (k, v) != ("mode", "keyword")}
            if results.next_cursor is not None:
                next_link = "/search?" + urlencode({**kept, "cursor": results.next_cursor})
            if results.previous_cursor is not None:
                previous_link = "/search?" + urlencode({**kept, "cursor": results.previous_cursor})
        return console.page(
            "search.html",
            scope=scope,
            fields=fields,
            asked=bool(q),
            results=results,
            next_link=next_link,
            previous_link=previous_link,
            session_link=lambda sid, seq: (
                "/session?" + urlencode({"id": sid, "after": max(seq - 1, 0)}) + f"#m{seq}"
            ),
        )

    @app.get("/insights", include_in_schema=False)
    def insights_page(
        request: Request, since: Since = None, until: Since = None, tenant: Tenant = None
    ) -> Response:
        scope = console.scope(tenant)
        if scope.repository is None:
            return console.choose(request, scope)
        bounds = {"since": _moment(since, "since"), "until": _moment(until, "until")}
        return console.page(
            "insights.html",
            scope=scope,
            fields={"since": since or "", "until": until or ""},
            **views.insights_page(scope.repository, **bounds),
        )

    @app.get("/health", include_in_schema=False)
    def health_page(done: Text = None, tenant: Tenant = None) -> Response:
        # The store's health, whoever asks (the doctor, the outbox, the one search
        # index): the tenant is only kept in the page's links.
        try:
            scope = console.scope(tenant)
        except BackendUnavailable:
            scope = None  # the primary is down: the health page is what shows it
        return console.page(
            "health.html", scope=scope, health=console.health(), done=_DONE.get(done or "")
        )

    @app.get("/audit", include_in_schema=False)
    def audit_page(request: Request, done: Text = None, tenant: Tenant = None) -> Response:
        scope = console.scope(tenant)
        if scope.repository is None:
            return console.choose(request, scope)
        entries = scope.repository.privacy_audit(limit=200)
        return console.page(
            "audit.html",
            scope=scope,
            entries=entries,
            done=_DONE.get(done or ""),
            visible=views.visible,
        )

    @app.get("/login", include_in_schema=False)
    def login_form(next: Text = None) -> Response:
        return console.page("login.html", failed=False, next=local_path(next))

    @app.post("/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        form = await _form(request)
        target = local_path(form.get("next"))
        if console.guard.token is None:
            return RedirectResponse(target, 303)
        if not console.guard.token_matches(form.get("token", "")):
            return console.page("login.html", 401, failed=True, next=target)
        response = RedirectResponse(target, 303)
        response.set_cookie(
            COOKIE,
            console.guard.sign_in(),
            max_age=int(console.guard.session_lifetime),
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path="/",
        )
        return response

    @app.post("/logout", include_in_schema=False)
    async def logout(request: Request) -> Response:
        form = await _form(request)
        problem = console.guard.csrf_problem(request, form.get("csrf"))
        if problem is not None:
            return console.page("error.html", 403, message=problem, back="/")
        console.guard.sign_out(request.cookies.get(COOKIE))
        response = RedirectResponse("/login", 303)
        response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
        return response

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        exposition = observability.exposition()
        if exposition is None:
            return answer_text(
                "metrics are off: install prometheus-client (pip install 'sessionrepo[metrics]')",
                404,
            )
        body, content_type = exposition
        return Response(body, media_type=content_type)


def answer_text(text: str, status: int) -> Response:
    return Response(text + "\n", status, media_type="text/plain")


def _export(console: Console, repository: SessionRepository, session_id: str) -> Response:
    body = console.export(repository, session_id)
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in session_id)[:100]
    return Response(
        body,
        media_type="application/x-ndjson",
        headers={"Content-Disposition": f'attachment; filename="session-{name}.jsonl"'},
    )


def _api(app: FastAPI, console: Console) -> None:
    @app.get(
        "/api/sessions", response_model=None, responses={200: {"model": SessionList}, **_ERRORS}
    )
    def api_sessions(
        *,
        source: Text = None,
        user_id: Text = None,
        status: Annotated[Literal["open", "ended"] | None, Query()] = None,
        since: Since = None,
        cursor: Text = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = views.LISTING_PAGE,
        tenant: Tenant = None,
    ) -> Response:
        """Sessions, newest activity first, a page at a time (keyset cursor)."""
        page = views.listing_page(
            console.read(tenant)[0],
            source=source,
            user_id=user_id,
            status=status,
            since=_moment(since, "since"),
            cursor=cursor,
            limit=limit,
        )
        return _json(SessionList(sessions=page.sessions, next_cursor=page.next_cursor))

    @app.get(
        "/api/session", response_model=None, responses={200: {"model": SessionDetail}, **_ERRORS}
    )
    def api_session(id: SessionId, tenant: Tenant = None) -> Response:
        """A session, its continuation chain (ancestors) and the chain's tip."""
        repository, _ = console.read(tenant)
        session = repository.get_session(id)
        chain = [s.id for s in repository.session_chain(id)]
        tip = repository.resolve_tip(id).id
        return _json(SessionDetail(session=session, chain=chain, tip=tip))

    @app.get(
        "/api/session/messages",
        response_model=None,
        responses={200: {"model": MessagePage}, **_ERRORS},
    )
    def api_messages(
        *,
        id: SessionId,
        after: Seq = None,
        before: Seq = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = views.TRANSCRIPT_PAGE,
        tenant: Tenant = None,
    ) -> Response:
        """A page of the transcript, in ``seq`` order (``after``: forward, ``before``: back)."""
        repository, _ = console.read(tenant)
        if after is not None and before is not None:
            raise InvalidArgument("before", "give after or before, not both")
        if before is not None:
            loaded = repository.load_transcript(id, before_seq=before, limit=limit + 1)
            messages = loaded[-limit:]
            next_after = messages[-1].seq if messages else None
            previous = messages[0].seq if len(loaded) > limit else None
        else:
            loaded = repository.load_transcript(id, after_seq=after, limit=limit + 1)
            messages = loaded[:limit]
            next_after = messages[-1].seq if len(loaded) > limit else None
            previous = None if after is None or not messages else messages[0].seq
        return _json(
            MessagePage(messages=messages, next_after=next_after, previous_before=previous)
        )

    @app.get(
        "/api/session/export",
        response_model=None,
        responses={
            200: {"content": {"application/x-ndjson": {}}, "description": "JSON Lines"},
            **_ERRORS,
        },
    )
    def api_export(id: SessionId, tenant: Tenant = None) -> Response:
        """The session in the ``sessionrepo export`` format (JSON Lines), as a download."""
        return _export(console, console.read(tenant)[0], id)

    @app.get(
        "/api/search", response_model=None, responses={200: {"model": SearchResults}, **_ERRORS}
    )
    def api_search(
        *,
        q: Annotated[str, Query(min_length=1, max_length=1024)],
        source: Text = None,
        role: Text = None,
        user_id: Text = None,
        session_id: Annotated[str | None, Query(min_length=1, max_length=255)] = None,
        since: Since = None,
        until: Since = None,
        order: Annotated[Literal["rank", "newest"], Query()] = "rank",
        cursor: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
        limit: Annotated[int, Query(ge=1, le=1000)] = views.SEARCH_PAGE,
        tenant: Tenant = None,
    ) -> Response:
        """Messages matching ``q``: words, "phrases", ``prefix*``, ``-excluded``."""
        page = views.search_page(
            console.read(tenant)[0],
            q,
            cursor=cursor,
            limit=limit,
            order=order,
            source=source,
            role=role,
            user_id=user_id,
            session_id=session_id,
            since=_moment(since, "since"),
            until=_moment(until, "until"),
        )
        return _json(SearchResults(hits=[h.hit for h in page.hits], next_cursor=page.next_cursor))

    @app.get("/api/health", response_model=None, responses={200: {"model": Health}, **_ERRORS})
    def api_health() -> Response:
        """``doctor``'s checks, the outbox per session, the search backlog and index state."""
        return _json(console.health())


def _writes(app: FastAPI, console: Console) -> None:
    async def checked(
        request: Request, page_of: Callable[[dict[str, str]], str]
    ) -> dict[str, str] | Response:
        """The form, or the refusal; ``page_of(form)`` is the page that offers it."""
        if not console.guard.allow_writes:
            return console.page(
                "error.html",
                403,
                message="read-only console (start it with --allow-writes)",
                back=None,
            )
        form = await _form(request)
        problem = console.guard.csrf_problem(request, form.get("csrf"))
        if problem is not None:
            return console.page("error.html", 403, message=problem, back=page_of(form))
        return form

    def kept(form: dict[str, str]) -> str | None:
        """The form's tenant when it names one of this store's (else none: never echoed)."""
        try:
            return console.scope(form.get("tenant")).tenant
        except RepoError:
            return None

    def session_of(form: dict[str, str]) -> str:
        return with_tenant("/session?" + urlencode({"id": form.get("id", "")}), kept(form))

    def health_of(form: dict[str, str]) -> str:
        return with_tenant("/health", kept(form))

    def back_to_session(form: dict[str, str], done: str) -> Response:
        target = "/session?" + urlencode({"id": form.get("id", ""), "done": done})
        return RedirectResponse(with_tenant(target, kept(form)), 303)

    @app.post("/actions/end", include_in_schema=False)
    async def end(request: Request) -> Response:
        form = await checked(request, session_of)
        if isinstance(form, Response):
            return form
        repository, _ = await run_in_threadpool(console.read, form.get("tenant"))
        ended = await run_in_threadpool(
            repository.end_session, form.get("id", ""), form.get("reason") or "operator"
        )
        return back_to_session(form, "ended" if ended else "not-ended")

    @app.post("/actions/reopen", include_in_schema=False)
    async def reopen(request: Request) -> Response:
        form = await checked(request, session_of)
        if isinstance(form, Response):
            return form
        repository, _ = await run_in_threadpool(console.read, form.get("tenant"))
        reopened = await run_in_threadpool(repository.reopen_session, form.get("id", ""))
        return back_to_session(form, "reopened" if reopened else "not-reopened")

    @app.post("/actions/erase", include_in_schema=False)
    async def erase(request: Request) -> Response:
        form = await checked(request, session_of)
        if isinstance(form, Response):
            return form
        if form.get("confirm") != "yes":
            return console.page(
                "error.html",
                400,
                message="tick the box to confirm the erasure",
                back=session_of(form),
            )
        repository, scope = await run_in_threadpool(console.read, form.get("tenant"))
        await run_in_threadpool(
            lambda: repository.erase(session_id=form.get("id", ""), actor="console")
        )
        return RedirectResponse(with_tenant("/audit?done=erased", scope.tenant), 303)

    @app.post("/actions/retry-dead", include_in_schema=False)
    async def retry_dead(request: Request) -> Response:
        form = await checked(request, health_of)
        if isinstance(form, Response):
            return form
        await run_in_threadpool(console.outbox.retry_dead, form.get("session") or None)
        return RedirectResponse(with_tenant("/health?done=retried", kept(form)), 303)

    @app.post("/actions/reindex", include_in_schema=False)
    async def reindex(request: Request) -> Response:
        form = await checked(request, health_of)
        if isinstance(form, Response):
            return form
        started = console.reindexing.start()
        done = "reindex-started" if started else "reindex-running"
        return RedirectResponse(with_tenant("/health?done=" + done, kept(form)), 303)


async def _form(request: Request) -> dict[str, str]:
    """An url-encoded form's fields (the first value of each)."""
    body = await request.body()
    fields = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return {name: values[0] for name, values in fields.items()}


@jinja2.pass_context
def _tenanted(context: jinja2.runtime.Context, url: str) -> str:
    """``url`` (one of the console's own) with the page's ``tenant=``, when one was chosen:
    every link and redirect of an operator's page stays with its tenant."""
    tenant = context.get("tenant")
    return url if not tenant else with_tenant(url, tenant)


def with_tenant(url: str, tenant: str | None) -> str:
    if not tenant:
        return url
    path, mark, fragment = url.partition("#")
    return path + ("&" if "?" in path else "?") + urlencode({"tenant": tenant}) + mark + fragment


def _when(value: datetime | None) -> str:
    return "-" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _age(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


__all__ = ["Console", "create_app"]
