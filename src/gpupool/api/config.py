"""One loader for the services' configuration objects (scheduler, agent, webhook).

Each service describes its settings as a pydantic model and names a `ConfigLoader` for it: the model, the
prefix of its environment variables and the name its errors carry. `load(file, flags, env)` merges, per
field, defaults < file (YAML, the field names as keys) < environment < flags, and validates once:

* the environment: `<PREFIX><FIELD>` (e.g. GPUPOOL_AGENT_SPLIT=4), plus the service's aliases (a plain
  variable read before the prefixed one, only when not empty: the agent's NODE_NAME, which a DaemonSet
  fills from spec.nodeName). Text is converted by the field's type: a tuple is comma-separated, a mapping
  is JSON (the Helm chart writes it with toJson; blank = empty), anything else is left to pydantic. When no
  `env` is given the process environment is read: the services read it nowhere else;
* flags: None means "not given", and so does () (a repeatable click option that was not used).

Every error is a `ConfigError` that names the field and where its value came from, so that the command
can print it as a usage error (exit 2) instead of a traceback.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import UnionType
from typing import Any, Generic, TypeVar, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


class ConfigError(ValueError):
    """A configuration a service cannot start with; the message says which field and from where."""


@dataclass(frozen=True, slots=True)
class ConfigLoader(Generic[M]):
    model: type[M]
    env_prefix: str  # GPUPOOL_<SERVICE>_
    name: str  # "agent": errors read "agent config split: ..."
    # field -> a variable read before <PREFIX><FIELD> when it is not empty
    env_aliases: Mapping[str, str] = field(default_factory=dict)
    # field -> what to do about it, added to its errors (a required field says where it may be given)
    hints: Mapping[str, str] = field(default_factory=dict)

    def load(
        self, file: str | Path | None = None, flags: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> M:
        """The configuration from defaults < `file` < `env` (None: the process environment) < `flags`."""
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}  # field -> where its value came from, for the errors
        if file is not None:
            loaded = self._read(Path(file))
            values.update(loaded)
            sources.update(dict.fromkeys(loaded, f"in {file}"))
        found = self._from_env(os.environ if env is None else env)
        values.update({k: v for k, (v, _) in found.items()})
        sources.update({k: where for k, (_, where) in found.items()})
        given = {k: v for k, v in (flags or {}).items() if v is not None and v != ()}
        values.update(given)
        for k in given:
            sources.pop(k, None)  # a flag the user typed needs no pointer to it
        try:
            return self.model(**values)
        except ValidationError as e:
            problems = [self._problem(err["loc"], err["msg"], sources) for err in e.errors()]
            raise ConfigError(f"{self.name} config " + "; ".join(problems)) from None

    def _read(self, file: Path) -> dict[str, Any]:
        try:
            loaded = yaml.safe_load(file.read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise ConfigError(f"{self.name} config file {file}: {e}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(
                f"{self.name} config file {file}: expected a mapping at the top level, got {type(loaded).__name__}"
            )
        return {str(k): v for k, v in loaded.items()}

    def _from_env(self, env: Mapping[str, str]) -> dict[str, tuple[Any, str]]:
        """field -> (value, the variable it came from) for every field the environment sets."""
        out: dict[str, tuple[Any, str]] = {}
        for name, info in self.model.model_fields.items():
            keys = [self.env_prefix + name.upper()]
            alias = self.env_aliases.get(name)
            if alias is not None and env.get(alias):
                keys.insert(0, alias)
            for key in keys:
                if key in env:
                    text = env[key]
                    out[name] = (env_value(info.annotation, key, text), f"{key}={_quoted(text)}")
        return out

    def _problem(self, loc: tuple[int | str, ...], msg: str, sources: Mapping[str, str]) -> str:
        where = ".".join(str(p) for p in loc) or "config"
        top = str(loc[0]) if loc else ""
        hint = f" ({self.hints[top]})" if top in self.hints else ""
        source = f" ({sources[top]})" if top in sources else ""
        return f"{where}: {msg}{hint}{source}"


def _quoted(text: str, limit: int = 80) -> str:
    """An environment value in an error: quoted (control characters escaped by repr) and bounded."""
    return repr(text[:limit]) + (f" (+{len(text) - limit} characters)" if len(text) > limit else "")


def env_value(annotation: Any, key: str, text: str) -> Any:
    """An environment variable's text as a value for a field of type `annotation`."""
    kind = _outer(annotation)
    if kind is tuple:
        return tuple(p.strip() for p in text.split(",") if p.strip())
    if kind is dict or (isinstance(kind, type) and issubclass(kind, BaseModel)):
        try:
            return json.loads(text) if text.strip() else {}
        except json.JSONDecodeError as e:
            raise ConfigError(f"{key}: not JSON ({e})") from None
    return text


def _outer(annotation: Any) -> Any:
    """The container type of an annotation (`tuple[int, ...]` -> tuple), looking through `X | None`."""
    origin = get_origin(annotation)
    if origin in (Union, UnionType):
        real = [a for a in get_args(annotation) if a is not type(None)]
        return _outer(real[0]) if len(real) == 1 else None
    return origin or annotation
