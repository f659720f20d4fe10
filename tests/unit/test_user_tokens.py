"""The user tokens file (ratewarden/tokens.py) and the daemon's tokens (service/auth.py):
every mistake named (file, user, what is wrong), never a token; one credential, one
identity; the service tokens' globs (RATEWARDEN_API_TOKEN_USERS) validated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from ratewarden.service import auth
from ratewarden.service.settings import Settings
from ratewarden.wire.tokens import read_tokens

ALICE = "alice-token-0123456789"
BOB = "bob-token-0123456789ab"


def written(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "users.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("", "expected a mapping of user: token"),
        ("{}", "expected a mapping of user: token"),
        ("- alice\n", "expected a mapping of user: token"),
        (f"alice: {ALICE}\nbob: {ALICE}\n", "users 'alice' and 'bob' share a token"),
        (f"alice: {ALICE}\nalice: {BOB}\n", "user 'alice' is listed twice"),
        ("alice: []\n", "user 'alice': no token"),
        ("alice: short\n", "user 'alice': a token of at least 16 characters"),
        ('alice: "token with spaces 0123"\n', "user 'alice': a token of printable ASCII"),
        ('alice: "tab\\ttoken-0123456789"\n', "user 'alice': a token of printable ASCII"),
        (f'"ali\\u001bce": {ALICE}\n', "a name of printable characters"),
        (f'"alice ": {ALICE}\n', "without spaces around it"),
        (f"123: {ALICE}\n", "user 123: a name of 1-256 characters"),
        (f"alice: {{a: {ALICE}}}\n", "user 'alice': a token of at least 16 characters"),
    ],
)
def test_every_mistake_is_named_with_its_file_and_user(
    tmp_path: Path, text: str, named: str
) -> None:
    path = written(tmp_path, text)
    with pytest.raises(ValueError, match="tokens file") as raised:
        read_tokens(path)
    message = str(raised.value)
    assert message.startswith(f"tokens file {path}: "), message
    assert named in message
    assert ALICE not in message
    assert BOB not in message


def test_a_yaml_error_names_its_place_but_never_quotes_the_line(tmp_path: Path) -> None:
    path = written(tmp_path, f"alice: {ALICE}\nbob: [{BOB}\n")
    with pytest.raises(ValueError, match="tokens file") as raised:
        read_tokens(path)
    assert "line" in str(raised.value)
    assert BOB not in str(raised.value)


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"tokens file .*nowhere\.yaml"):
        read_tokens(tmp_path / "nowhere.yaml")


def test_names_are_kept_exactly_as_written(tmp_path: Path) -> None:
    path = written(tmp_path, f"Alice: {ALICE}\nalicé: {BOB}\n")
    assert read_tokens(path) == {ALICE: "Alice", BOB: "alicé"}


@pytest.mark.parametrize("setting", ["api_tokens", "admin_tokens"])
def test_a_token_both_a_users_and_a_service_or_admin_token_is_refused(
    tmp_path: Path, setting: str
) -> None:
    path = written(tmp_path, f"alice: {ALICE}\n")
    tokens: dict[str, Any] = {setting: [ALICE]}
    settings = Settings(user_tokens=path, **tokens)
    with pytest.raises(ValueError, match="tokens file") as raised:
        auth.Tokens.from_settings(settings)
    assert f"RATEWARDEN_{setting.upper()}" in str(raised.value)
    assert "user 'alice'" in str(raised.value)
    assert ALICE not in str(raised.value)
    # `serve` refuses to start, saying so (auth.bind_problem).
    problem = auth.bind_problem(settings)
    assert problem is not None
    assert "RATEWARDEN_USER_TOKENS" in problem


def test_a_user_token_identifies_its_user_and_only_with_the_check_role(tmp_path: Path) -> None:
    path = written(tmp_path, f"alice: [{ALICE}, {BOB}]\n")
    tokens = auth.Tokens(["svc-0123456789abcdef"], ["adm-0123456789abcdef"], users_file=path)
    for token in (ALICE, BOB):
        role, name, caller = tokens.identify(token.encode())
        assert (role, name, caller) == (auth.ApiRole.CHECK, None, auth.Caller(user="alice"))
    assert tokens.identify(b"svc-0123456789abcdef")[2] is auth.ANYONE
    assert tokens.identify(b"adm-0123456789abcdef")[:2] == (auth.ApiRole.ADMIN, "admin token 1")
    assert tokens.identify(b"alice-token-012345678X")[0] is auth.ApiRole.NONE
    assert tokens.users == 1


def test_the_file_is_read_again_and_a_bad_one_keeps_the_tokens_in_force(tmp_path: Path) -> None:
    path = written(tmp_path, f"alice: {ALICE}\n")
    tokens = auth.Tokens([], [], users_file=path)
    path.write_text(f"alice: {ALICE}\nalice: {BOB}\n")
    problem = tokens.reload_users()
    assert problem is not None
    assert "listed twice" in problem
    assert tokens.identify(ALICE.encode())[2] == auth.Caller(user="alice")  # still in force
    path.write_text(f"bob: {BOB}\n")
    assert tokens.reload_users() is None
    assert tokens.identify(ALICE.encode())[0] is auth.ApiRole.NONE  # revoked
    assert tokens.identify(BOB.encode())[2] == auth.Caller(user="bob")


def test_service_token_globs_are_per_token_in_order() -> None:
    settings = Settings(
        api_tokens=["svc-a-0123456789", "svc-b-0123456789", "svc-c-0123456789"],
        api_token_users=["team-a-* bot-?", "*"],
    )
    assert settings.service_globs() == [("team-a-*", "bot-?"), None, None]
    tokens = auth.Tokens.from_settings(settings)
    caller = tokens.identify(b"svc-a-0123456789")[2]
    assert caller.may_act_for("team-a-x")
    assert caller.may_act_for("bot-7")
    assert not caller.may_act_for("team-b-x")
    assert not caller.may_act_for("bot-77")
    assert not caller.may_act_for("TEAM-A-x")  # exact: globs match case too


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"api_tokens": ["svc-a-0123456789"], "api_token_users": ["a*", "b*"]}, "api_token_users"),
        ({"api_tokens": ["svc-a-0123456789"], "api_token_users": ["a\x1b*"]}, "api_token_users"),
    ],
)
def test_a_bad_glob_setting_is_named(values: dict[str, object], named: str) -> None:
    with pytest.raises(ValidationError, match=named):
        Settings(**values)  # type: ignore[arg-type]
