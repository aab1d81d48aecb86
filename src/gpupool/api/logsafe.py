"""Names shown to people (log lines, terminal, error messages) made safe: control characters escaped,
length bounded.

Pod, container and node names come from tenants or from callers of gpupool's HTTP endpoints. Written
raw, a name with `\\n` forges log lines, one with `\\x1b]8;;http://evil\\x1b\\\\` puts a link or colours into
whoever reads the log in a terminal, and a 4 MiB name makes every line 4 MiB. `shown` keeps printable
text as it is and writes everything else as a Python-style escape, so the reader sees exactly which
bytes were there.
"""

from __future__ import annotations

# Kubernetes names are at most 253 characters; a little more keeps a namespace/name pair whole.
MAX_SHOWN = 300

# str.isprintable is False for every control (Cc), format (Cf: bidirectional overrides that reorder what a
# terminal shows, "Trojan Source"; zero-width characters that hide text), surrogate, private-use,
# unassigned and separator character except the plain space: exactly what must not reach a reader raw.


def _escape(ch: str) -> str:
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def shown(text: object, limit: int = MAX_SHOWN) -> str:
    """`text` with control and invisible characters escaped and at most `limit` characters kept (the rest
    is counted, not shown). A backslash is escaped too, so an escape in the output is never ambiguous."""
    raw = str(text)
    head, rest = raw[:limit], len(raw) - limit
    out = []
    for ch in head:
        if ch == "\\":
            out.append("\\\\")
        else:
            out.append(ch if ch.isprintable() else _escape(ch))
    if rest > 0:
        out.append(f"...(+{rest} characters)")
    return "".join(out)
