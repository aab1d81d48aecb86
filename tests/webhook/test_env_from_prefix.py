"""Property of the envFrom rule (gpupool.webhook.forbidden.env_from_safe): a prefix is called safe exactly
when no ConfigMap or Secret key appended to it makes a variable the webhook refuses in `env`."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpupool.webhook.forbidden import FORBIDDEN_ENV, FORBIDDEN_ENV_PREFIXES, env_forbidden, env_from_safe

KEY_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz0123456789-."  # ConfigMap key characters
PIECES = st.sampled_from(sorted(FORBIDDEN_ENV) + list(FORBIDDEN_ENV_PREFIXES))
# Prefixes near the refused names (pieces of them, extended or cut) and arbitrary ones.
PREFIXES = (PIECES.flatmap(lambda n: st.integers(0, len(n)).map(lambda k: n[:k]))
            | st.tuples(PIECES, st.text(KEY_CHARS, max_size=4)).map("".join)
            | st.text(KEY_CHARS, max_size=12))


def completions(prefix: str) -> list[str]:
    """Keys that would turn `prefix` into a refused name, if any can (the rest of a refused name, or of a
    refused prefix plus one more character)."""
    out = [n[len(prefix):] for n in FORBIDDEN_ENV if n.startswith(prefix) and n != prefix]
    out += [p[len(prefix):] + "X" for p in FORBIDDEN_ENV_PREFIXES if p.startswith(prefix)]
    out += ["X" for p in FORBIDDEN_ENV_PREFIXES if prefix.startswith(p)]
    return out


@given(PREFIXES, st.text(KEY_CHARS, min_size=1, max_size=30))
def test_a_safe_prefix_never_makes_a_refused_name(prefix: str, key: str) -> None:
    if env_from_safe(prefix):
        assert not env_forbidden(prefix + key)


@given(PREFIXES)
def test_an_unsafe_prefix_has_a_key_that_makes_a_refused_name(prefix: str) -> None:
    if not env_from_safe(prefix):
        assert prefix == "" or any(env_forbidden(prefix + key) for key in completions(prefix))
