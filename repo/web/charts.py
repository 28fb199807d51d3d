"""Server-side SVG charts for the console (no script, nothing from elsewhere: the CSP
stays as it is). Horizontal bars, each with its label and its value written beside it,
so a chart reads the same without colour and to a screen reader (its ``<title>`` and
``aria-label``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from markupsafe import Markup

WIDTH = 640
ROW = 22
LABEL = 170
VALUE = 110


def bar_chart(
    chart_id: str,
    title: str,
    items: Sequence[tuple[str, float | None]],
    shown: Callable[[float], str] = lambda value: f"{value:,.0f}",
    unknown: str = "unknown",
) -> Markup:
    """A chart of ``items`` (label, value), one bar each, longest = largest value; a
    value ``None`` (not known, e.g. a cost without a price) draws no bar and says
    ``unknown`` in words, never a zero."""
    if not items:
        return Markup('<p class="empty" id="{}">{}: nothing in this range.</p>').format(
            chart_id, title
        )
    top = max((value for _, value in items if value is not None), default=0.0) or 1.0
    span = WIDTH - LABEL - VALUE
    height = ROW * len(items) + 8
    parts = [
        Markup('<h3 class="chart-title">{}</h3>').format(title),  # what it shows, in words
        Markup(
            '<svg class="chart" id="{}" role="img" aria-label="{}" viewBox="0 0 {} {}" '
            'width="{}" height="{}" xmlns="http://www.w3.org/2000/svg"><title>{}</title>'
        ).format(chart_id, title, WIDTH, height, WIDTH, height, title),
    ]
    for index, (label, value) in enumerate(items):
        y = 4 + index * ROW
        length = 0 if value is None else max(round(span * value / top), 1 if value else 0)
        text = unknown if value is None else shown(value)
        parts.append(
            Markup(
                '<g class="bar" data-label="{}" data-value="{}"><title>{}: {}</title>'
                '<text x="{}" y="{}" text-anchor="end" class="label">{}</text>'
                '<rect x="{}" y="{}" width="{}" height="{}" fill="currentColor"></rect>'
                '<text x="{}" y="{}" class="value">{}</text></g>'
            ).format(
                label,
                "" if value is None else value,
                label,
                text,
                LABEL - 6,
                y + 15,
                _short(label),
                LABEL,
                y + 3,
                length,
                ROW - 6,
                LABEL + length + 6,
                y + 15,
                text,
            )
        )
    parts.append(Markup("</svg>"))
    return Markup("").join(parts)


def _short(label: str, limit: int = 24) -> str:
    return label if len(label) <= limit else label[: limit - 1] + "…"


__all__ = ["bar_chart"]
