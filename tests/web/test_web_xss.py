"""Every transcript is hostile input: the XSS corpus (script tags, event handlers,
``javascript:`` URLs, SVG, CSS, markup breakouts, template syntax, Unicode direction and
invisible characters) is stored in ids, titles, messages, reasoning, tool calls and
outputs, and metadata; on every page that shows it nothing executes (the page's sentinel
is untouched, no dialog, no console error, no CSP violation) and nothing but the
console's own markup is in the document."""

from __future__ import annotations

from urllib.parse import urlencode

import pytest
from _console_data import XSS, XSS_SESSION
from conftest import Server, Watched

from sessionrepo.web.views import ROLE_CLASSES

pytestmark = pytest.mark.slow

#: What the document may hold besides escaped text: the console's own elements only.
INERT_CHECK = """() => ({
  scripts: [...document.scripts].map(s => s.getAttribute("src")),
  styles: document.querySelectorAll("style").length,
  frames: document.querySelectorAll("iframe, frame, object, embed").length,
  svgs: document.querySelectorAll("svg, math").length,
  metas: [...document.querySelectorAll("meta[http-equiv]")].length,
  images: [...document.images].map(i => i.getAttribute("src").slice(0, 22)),
  jsLinks: [...document.querySelectorAll("[href]")].filter(
      a => !/^(\\/|#|data:,$)/.test(a.getAttribute("href"))).map(a => a.getAttribute("href")),
  handlers: [...document.querySelectorAll("*")].flatMap(
      e => [...e.attributes].filter(a => a.name.startsWith("on")).map(a => a.name)),
  styled: document.querySelectorAll("[style]").length,
  forms: [...document.forms].map(f => f.getAttribute("action")),
})"""


def _assert_inert(page: Watched) -> None:
    found = page.page.evaluate(INERT_CHECK)
    assert found["scripts"] == ["/static/console.js"]
    assert found["styles"] == 0
    assert found["frames"] == 0
    assert found["svgs"] == 0
    assert found["metas"] == 0
    assert all(src.startswith("data:image/png;base64") for src in found["images"])
    assert found["jsLinks"] == []
    assert found["handlers"] == []
    assert found["styled"] == 0
    assert all(action.startswith("/") for action in found["forms"])
    assert page.errors == []
    assert page.dialogs == []
    assert page.sentinel() == ["untouched", True]


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/?" + urlencode({"source": "<script>window.__pwned=1</script>"}),
        "/session?" + urlencode({"id": XSS_SESSION}),
        "/search?" + urlencode({"q": "xss needle", "order": "newest"}),
        "/search?" + urlencode({"q": XSS[1], "source": XSS[0], "user": XSS[3]}),
        "/session?" + urlencode({"id": XSS[0]}),  # an error page quoting the id
        "/health",
    ],
)
def test_the_corpus_renders_inert(page: Watched, console: Server, path: str) -> None:
    page.page.goto(console.url(path))
    page.page.wait_for_load_state("load")
    if path.startswith("/session?id=%3Cscript"):
        assert page.page.locator("#error").inner_text().startswith("no session")
        page.errors.clear()  # the 404 status itself
    _assert_inert(page)


def test_the_corpus_is_shown_as_text_with_hidden_characters_spelled_out(
    page: Watched, console: Server
) -> None:
    tab = page.page
    tab.goto(console.url("/session?" + urlencode({"id": XSS_SESSION})))
    tab.click("button[data-toggle-details=open]")  # every fold open: tool calls, reasoning
    text = tab.locator("main").inner_text()
    for payload in XSS[:11]:
        assert payload in text
    assert "admin<U+202E>gnp.exe" in text
    assert "zero<U+200B>width<U+2066>isolate<U+2069>" in text
    assert tab.locator("#session-title").inner_text().endswith("admin<U+202E>gnp.exe")
    # The session's hostile id round-trips through the links it is in.
    assert tab.locator("#session-id").inner_text() == XSS_SESSION
    # An SVG or javascript: "image" is never drawn, only described.
    assert tab.locator("figure.image").count() == 0
    # Hostile item types are shown as text and styled by a fixed class, never by name.
    classes = tab.locator("article.message").evaluate_all(
        "els => [...new Set(els.flatMap(e => [...e.classList]))]"
    )
    assert set(classes) <= {"message"} | {f"role-{name}" for name in ROLE_CLASSES}
    assert "role-assistant" in classes  # the hostile "..._call" items, as calls
    roles = tab.locator("article.message").evaluate_all("els => els.map(e => e.dataset.role)")
    for payload in XSS[:11]:
        assert f"{payload}_call_output" in roles
    _assert_inert(page)
