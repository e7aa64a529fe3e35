"""Text that came from a container's spec (its annotations, ids, env), made safe
for every place the tools show it. Anything a spec carries is the tenant's:
runc accepts any JSON string, so a value may hold a lone surrogate (JSON's
"\\ud800"), control characters (a newline, an ESC sequence that drives a
terminal, NUL) or a megabyte.

- `value`: a tenant's value as the tools carry it (a Prometheus label, a JSON
  field, a table cell before it is printed): text only, cut at MAX_SHOWN
  characters, valid UTF-8, and printable but for newlines: every other
  character that is not printable (ESC, NUL, a C1 control, a bidi override) is
  `?`. The Prometheus text format escapes only backslash, quote and newline,
  so nothing else may reach it raw; JSON and the tables escape the newline.
- `valid_utf8`: any text as UTF-8 can carry it: a lone surrogate is written as
  its `\\udXXX` escape (a scrape or a print of it would fail otherwise).
- `one_line`: text for a terminal: valid UTF-8, and every character that is
  not printable (a newline, ESC, NUL, a C1 control, a bidi override) shown as
  `?`, so nothing a tenant wrote moves the cursor or forges a line.
- `echo`: prints text whose every line is one_line: the tools' tables and
  lines go out through it.
"""
from __future__ import annotations

import click

MAX_SHOWN = 256  # the longest Kubernetes name (a DNS subdomain) is 253: none is ever cut


def valid_utf8(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def value(raw, limit: int = MAX_SHOWN) -> str:
    """'' for what is not text; cut before it is escaped, so a megabyte costs
    no more than `limit` characters."""
    if not isinstance(raw, str):
        return ""
    text = valid_utf8(raw[:limit])[:limit]
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() or ch == "\n" else "?" for ch in text)


def one_line(text: str) -> str:
    text = valid_utf8(text)
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else "?" for ch in text)


def echo(text: str, err: bool = False) -> None:
    click.echo("\n".join(one_line(line) for line in text.split("\n")), err=err)
