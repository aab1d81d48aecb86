"""The services' one configuration loader (gpupool.api.config): flag > environment > file > default per
field, environment text converted by the field's type, and errors that name the field and its source."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, Field

from gpupool.api.config import ConfigError, ConfigLoader


class Inner(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    strict: bool = False


class Toy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    node_name: str = Field(min_length=1)
    port: int = Field(default=80, ge=1, le=65535)
    host: str = "localhost"
    xids: tuple[int, ...] = (13,)
    users: tuple[str, ...] = ()
    policies: dict[str, Inner] = Field(default_factory=dict)
    fake_file: Path | None = None


LOADER = ConfigLoader(Toy, "TOY_", "toy", env_aliases={"node_name": "NODE_NAME"},
                      hints={"node_name": "set NODE_NAME or --node-name"})
NAMED = {"NODE_NAME": "n"}


def write(tmp_path: Path, values: dict[str, object]) -> Path:
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def test_each_field_takes_its_value_from_the_strongest_source_that_sets_it(tmp_path: Path) -> None:
    file = write(tmp_path, {"node_name": "f", "port": 1, "host": "file-host", "users": ["a"]})
    env = {"TOY_PORT": "2", "TOY_XIDS": "31, 43", "NODE_NAME": "e"}
    flags = {"port": 3, "host": None, "users": ()}
    config = LOADER.load(file, flags, env)
    assert config.port == 3  # flag over env over file
    assert config.host == "file-host"  # a None flag is not given: the file's
    assert config.users == ("a",)  # () is a repeatable flag not used: the file's
    assert config.xids == (31, 43)  # env over default, comma-separated
    assert config.node_name == "e"  # the alias from the environment over the file
    assert config.policies == {} and config.fake_file is None  # defaults


def test_the_prefixed_variable_beats_its_alias_and_an_empty_alias_counts_as_unset() -> None:
    assert LOADER.load(env={"NODE_NAME": "a", "TOY_NODE_NAME": "b"}).node_name == "b"
    assert LOADER.load(flags={"node_name": "f"}, env={"NODE_NAME": ""}).node_name == "f"
    with pytest.raises(ConfigError, match=r"^toy config node_name: Field required \(set NODE_NAME or --node-name\)$"):
        LOADER.load(env={"NODE_NAME": ""})


def test_environment_text_is_converted_by_the_field_type() -> None:
    env = {**NAMED, "TOY_USERS": " u1 ,, u2 ", "TOY_POLICIES": '{"p": {"strict": true}}', "TOY_FAKE_FILE": "/x.yaml",
           "TOY_XIDS": ""}
    config = LOADER.load(env=env)
    assert config.users == ("u1", "u2")
    assert config.policies == {"p": Inner(strict=True)}
    assert config.fake_file == Path("/x.yaml")
    assert config.xids == ()  # set, but to nothing
    assert LOADER.load(env={**NAMED, "TOY_POLICIES": "  "}).policies == {}


def test_no_env_reads_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "from-process")
    monkeypatch.setenv("TOY_PORT", "8080")
    config = LOADER.load()
    assert (config.node_name, config.port) == ("from-process", 8080)
    assert LOADER.load(env={"NODE_NAME": "given"}).port == 80  # a given environment is the only one read


@pytest.mark.parametrize(
    ("flags", "env", "message"),
    [
        ({"port": 0}, NAMED, "toy config port: Input should be greater than or equal to 1"),
        ({}, {**NAMED, "TOY_PORT": "http"},
         "toy config port: Input should be a valid integer, unable to parse string as an integer (TOY_PORT='http')"),
        ({}, {**NAMED, "TOY_XIDS": "13,x"}, "toy config xids.1: Input should be a valid integer, unable to parse "
                                             "string as an integer (TOY_XIDS='13,x')"),
        ({}, {**NAMED, "TOY_POLICIES": "{nope"}, "TOY_POLICIES: not JSON (Expecting property name"),
        ({}, {**NAMED, "TOY_PORT": "9" * 100}, "(+20 characters)"),
        ({}, {**NAMED, "TOY_HOST": "x", "TOY_PORT": "\x1b[31m"}, r"(TOY_PORT='\x1b[31m')"),
        # every problem, not the first only
        ({"port": 0, "host": 5}, NAMED, "toy config port: Input should be greater than or equal to 1; host: Input "
                                        "should be a valid string"),
    ],
)
def test_errors_name_the_field_and_where_its_value_came_from(
    flags: dict[str, object], env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        LOADER.load(None, flags, env)
    assert message in str(err.value)


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    file = write(tmp_path, {"prot": 1})
    with pytest.raises(ConfigError, match=rf"^toy config prot: Extra inputs are not permitted \(in {file}\)$"):
        LOADER.load(file, env=NAMED)
    file.write_text("- a\n")
    with pytest.raises(ConfigError, match=rf"^toy config file {file}: expected a mapping at the top level, got list$"):
        LOADER.load(file, env=NAMED)
    file.write_text("a: [\n")
    with pytest.raises(ConfigError, match=rf"^toy config file {file}: while parsing"):
        LOADER.load(file, env=NAMED)
    with pytest.raises(ConfigError, match=rf"^toy config file {tmp_path / 'gone.yaml'}: \[Errno 2\]"):
        LOADER.load(tmp_path / "gone.yaml", env=NAMED)
    file.write_text("")
    assert LOADER.load(file, env=NAMED).port == 80  # an empty file sets nothing


def test_a_flag_over_a_bad_environment_value_hides_it() -> None:
    """Fields are merged before validation: an overridden value is never checked."""
    assert LOADER.load(flags={"port": 5}, env={**NAMED, "TOY_PORT": "http"}).port == 5


PORTS = st.none() | st.integers(1, 65535)


@given(default=st.just(80), file=PORTS, env=PORTS, flag=PORTS)
def test_the_strongest_source_that_sets_a_field_wins(
    tmp_path_factory: pytest.TempPathFactory, default: int, file: int | None, env: int | None, flag: int | None
) -> None:
    path = None
    if file is not None:
        path = tmp_path_factory.mktemp("c") / "toy.yaml"
        path.write_text(f"port: {file}\n")
    environ = {**NAMED, **({"TOY_PORT": str(env)} if env is not None else {})}
    expected = next(v for v in (flag, env, file, default) if v is not None)
    assert LOADER.load(path, {"port": flag}, environ).port == expected
