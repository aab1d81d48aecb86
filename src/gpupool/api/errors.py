"""One wording for validation errors of the JSON documents gpupool reads (annotations, requests)."""

from __future__ import annotations

from pydantic import ValidationError


def first_problem(what: str, e: ValidationError) -> str:
    """`invalid <what> at <field path>: <message>` for the first problem pydantic found."""
    first = e.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "document"
    return f"invalid {what} at {where}: {first['msg']}"
