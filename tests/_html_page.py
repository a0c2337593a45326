"""The report page read back as a reader sees it: each tag with its attributes, the text
of each table cell by row, and the SVG charts' titles (shared by the unit and e2e page
tests)."""

from __future__ import annotations

import html.parser


class PageParts(html.parser.HTMLParser):
    """Every tag with its attributes, the text of each table cell, and SVG titles."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.rows: list[list[str]] = []
        self.titles: list[tuple[str, str]] = []  # (enclosing svg's aria-label, title text)
        self._cell: list[str] | None = None
        self._svg = ""
        self._title: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "svg":
            self._svg = dict(attrs).get("aria-label") or ""
        elif tag == "title" and self._svg:
            self._title = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "title" and self._title is not None:
            self.titles.append((self._svg, "".join(self._title)))
            self._title = None
        elif tag == "svg":
            self._svg = ""

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)
        if self._title is not None:
            self._title.append(data)
