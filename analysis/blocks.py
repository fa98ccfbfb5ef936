"""The generated blocks of a page: the text between `<!-- NAME: ... -->` and
`<!-- end NAME -->`."""

from __future__ import annotations

import re


def _block(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- {re.escape(name)}: [^>]*-->\n)(.*?)(\n<!-- end {re.escape(name)} -->)",
                      re.S)


def block_text(text: str, name: str) -> str:
    """The content of the page's generated block `name`."""
    match = _block(name).search(text)
    if not match:
        raise SystemExit(f"error: no generated block {name!r} in the page")
    return match.group(2)


def replace_block(text: str, name: str, content: str) -> str:
    block_text(text, name)
    return _block(name).sub(lambda m: m.group(1) + content + m.group(3), text)
