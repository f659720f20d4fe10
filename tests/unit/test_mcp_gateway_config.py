"""The MCP gateway's configuration, read before the SDK is imported: its upstreams
(`--server NAME=TARGET`), its users (the tokens file, the trusted proxy's header), and
its command line. Every mistake is refused with a message naming what is wrong."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from ratewarden.mcp import cli as command
from ratewarden.mcp.cli import cli
from ratewarden.mcp.identity import Identities, read_tokens
from ratewarden.mcp.upstream import Upstream, with_headers

TOKEN = "a-token-of-20-chars!"


# -- upstreams ----------------------------------------------------------------------------


def test_a_url_upstream() -> None:
    assert Upstream.parse("web=https://mcp.example/mcp") == Upstream(
        "web", url="https://mcp.example/mcp"
    )


def test_a_command_upstream_is_split_as_a_shell_would() -> None:
    parsed = Upstream.parse("files=npx -y '@scope/server files' --root /tmp")
    assert parsed == Upstream(
        "files", command=("npx", "-y", "@scope/server files", "--root", "/tmp")
    )


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("no-equals-sign", "NAME=URL"),
        ("=python server.py", "NAME=URL"),
        ("my.server=python s.py", "NAME=URL"),  # a dot would make `server.tool` ambiguous
        ("a/b=python s.py", "NAME=URL"),
        ("x" * 65 + "=python s.py", "NAME=URL"),
        ("files=", "files"),
        ("files=   ", "files"),
        ("files=python 'unclosed", "files"),
    ],
)
def test_a_bad_upstream_is_refused_naming_it(text: str, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        Upstream.parse(text)


# -- the tokens file -----------------------------------------------------------------------


def tokens_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tokens.yaml"
    path.write_text(text)
    return path


def test_tokens_map_each_token_to_its_user(tmp_path: Path) -> None:
    path = tokens_file(tmp_path, f"alice: {TOKEN}\nbob: [{TOKEN}x, {TOKEN}y]\n")
    assert read_tokens(path) == {TOKEN: "alice", f"{TOKEN}x": "bob", f"{TOKEN}y": "bob"}


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("", "a mapping of user: token"),
        ("[alice, bob]", "a mapping of user: token"),
        ("alice: short", "user 'alice': a token of at least 16"),
        ("alice: 12345678901234567", "user 'alice': a token of at least 16"),  # an int
        ("alice: 'has a space in it here'", "user 'alice': a token of printable ASCII"),
        ("alice: 'caf\u00e9-token-0123456789'", "user 'alice': a token of printable ASCII"),
        (f"alice: {TOKEN}\nbob: {TOKEN}", "users 'alice' and 'bob' share a token"),
        (f"{'u' * 257}: {TOKEN}", "a name of 1-256 characters"),
        (f"1: {TOKEN}", "user 1: a name"),
        ("alice: [unclosed", "tokens file"),
    ],
)
def test_a_bad_tokens_file_is_refused_naming_the_fault(
    tmp_path: Path, text: str, named: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(named)):
        read_tokens(tokens_file(tmp_path, text))


def test_a_missing_tokens_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"nowhere\.yaml"):
        read_tokens(tmp_path / "nowhere.yaml")


# -- who a request comes from ----------------------------------------------------------------


def scope(*headers: tuple[str, str], peer: str | None = "127.0.0.1") -> dict[str, Any]:
    return {
        "type": "http",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers],
        "client": (peer, 50000) if peer else None,
    }


def test_a_known_bearer_token_names_its_user() -> None:
    identities = Identities({TOKEN: "alice"})
    assert identities.user_of(scope(("Authorization", f"Bearer {TOKEN}"))) == "alice"
    assert identities.user_of(scope(("Authorization", f"bearer  {TOKEN} "))) == "alice"


@pytest.mark.parametrize(
    "authorization",
    ["", "Bearer", "Bearer ", f"Basic {TOKEN}", "Bearer not-the-token-at-all", f"Bearer {TOKEN}x"],
)
def test_anything_else_is_nobody(authorization: str) -> None:
    assert Identities({TOKEN: "alice"}).user_of(scope(("Authorization", authorization))) is None


def test_the_header_is_believed_only_when_configured_and_from_a_trusted_proxy() -> None:
    named = ("X-User", "carol")
    assert Identities({}).user_of(scope(named)) is None  # off unless configured
    believing = Identities({}, header="X-User")
    assert believing.user_of(scope(named)) == "carol"  # loopback by default
    assert believing.user_of(scope(named, peer="::1")) == "carol"
    assert believing.user_of(scope(named, peer="10.0.0.9")) is None
    assert believing.user_of(scope(named, peer=None)) is None
    proxied = Identities({}, header="X-User", proxies=["10.0.0.0/24"])
    assert proxied.user_of(scope(named, peer="10.0.0.9")) == "carol"
    assert proxied.user_of(scope(named)) is None  # loopback is no longer trusted


def test_a_wrong_token_is_not_rescued_by_the_header() -> None:
    both = scope(("Authorization", "Bearer guessed-token-12345"), ("X-User", "carol"))
    assert Identities({TOKEN: "alice"}, header="X-User").user_of(both) is None


@pytest.mark.parametrize("value", ["", "   ", "u" * 257, "carol\x00admin", "carol\tx"])
def test_a_header_naming_no_valid_user_is_nobody(value: str) -> None:
    assert Identities({}, header="X-User").user_of(scope(("X-User", value))) is None


# -- the command line -------------------------------------------------------------------------


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        cli(argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--listen", "127.0.0.1:9"], "--server"),
        (["--listen", "nowhere", "--server", "a=b"], "--listen: expected HOST:PORT"),
        (["--listen", "h:70000", "--server", "a=b"], "--listen: expected HOST:PORT"),
        (["--listen", "h:9", "--server", "a.b=c"], "--server: expected NAME=URL"),
        (["--listen", "h:9", "--server", "a=b"], "--tokens FILE or --user-header"),
        (["--listen", "h:9", "--server", "a=b", "--tokens", "/nowhere.yaml"], "nowhere.yaml"),
        (["--listen", "h:9", "--server", "a=b", "--user-header", "X", "--trusted-proxy", "x"],
         "--trusted-proxy"),
        (["--listen", "h:9", "--server", "a=b", "--user-header", "X", "--max-sessions", "0"],
         "--max-sessions: expected a whole number above 0"),
        (["--listen", "h:9", "--server", "a=b", "--user-header", "X", "--max-user-sessions", "0"],
         "--max-user-sessions: expected a whole number above 0"),
        (["--listen", "h:9", "--server", "a=b", "--user-header", "X", "--max-user-sessions",
          "few"], "--max-user-sessions: expected a whole number above 0"),
        (["--listen", "h:9", "--server", "a=b", "--user-header", "X", "--max-body-bytes", "1e6"],
         "--max-body-bytes: expected a whole number above 0"),
        (["--listen", "h:9", "--server", "a=b", "--user-header", "X", "--idle-timeout", "-1"],
         "--idle-timeout: expected seconds"),
        (["--listen", "h:9", "--server", "a=b", "--user-header", "X", "--user", "u"],
         "unrecognized arguments: --user"),  # the gateway's users come from who calls
        (["--listen", "h:9", "--server", "a=b", "--user-header", "X", "--", "python", "s.py"],
         "not after --"),
        (["--user", "u"], "give the server's command after --"),
    ],
)  # fmt: skip
def test_a_bad_command_line_is_refused_naming_the_flag(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert named in refused(argv, capsys)


def test_the_gateway_takes_its_users_from_the_daemons_user_tokens_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --tokens, RATEWARDEN_USER_TOKENS: the one file that says who everyone is."""
    monkeypatch.setenv("RATEWARDEN_USER_TOKENS", str(tokens_file(tmp_path, f"alice: {TOKEN}\n")))
    parser = command._gateway_parser()
    options = parser.parse_args(["--listen", "h:9", "--server", "a=b"])
    identities = command._identities(parser, options)
    assert identities.user_of(scope(("Authorization", f"Bearer {TOKEN}"))) == "alice"
    monkeypatch.setenv("RATEWARDEN_USER_TOKENS", str(tmp_path / "nowhere.yaml"))
    assert "nowhere.yaml" in refused(["--listen", "h:9", "--server", "a=b"], capsys)


# -- a URL upstream's own headers (--header NAME:HEADER=VALUE) ------------------------------

SECRET = "s3cr3t-0a1b2c3d4e5f"
SERVERS = ["--listen", "h:9", "--server", "web=https://mcp.example/mcp",
           "--server", "files=python s.py", "--user-header", "X"]  # fmt: skip


@pytest.mark.parametrize(
    ("header", "named"),
    [
        (f"web-Authorization={SECRET}", "--header: expected NAME:HEADER=VALUE"),
        (f"web:Authorization{SECRET}", "--header: expected NAME:HEADER=VALUE"),
        (f":Authorization={SECRET}", "--header: expected NAME:HEADER=VALUE"),
        (f"nowhere:Authorization={SECRET}", "--header: nowhere:Authorization: no --server"),
        (f"files:Authorization={SECRET}", "server 'files' is a command"),
        (f"web:Bad Name={SECRET}", "--header: server 'web': the header name is not an HTTP"),
        (f"web:Bad\r\nName={SECRET}", "the header name is not an HTTP token"),
        # curl's spelling, with an '=' in the secret: the secret is where a name should be
        (f"web:Authorization: Bearer {SECRET}=", "the header name is not an HTTP token"),
        (f"web-Authorization: Bearer {SECRET}=", "text not shown"),
        (f"web:Authorization=Bearer {SECRET}\r\nX-Evil: 1", "web:Authorization: the value has"),
        (f"web:Authorization=Bearer {SECRET}\n", "the value has a control character"),
        (f"web:Authorization=Bearer {SECRET}\0", "the value has a control character"),
        (f"web:Authorization=Bearer {SECRET}\x7f", "the value has a control character"),
        (f"web:Authorization=Bearer {SECRET}é", "outside ASCII"),
        (f"web:Host={SECRET}", "Host is the transport's own header"),
        (f"web:Mcp-Session-Id={SECRET}", "the transport's own header"),
        (f"web:Mcp-Param-Path={SECRET}", "the transport's own header"),
        ("web:Authorization=@env:RW_TEST_UNSET_VARIABLE", "'RW_TEST_UNSET_VARIABLE' is not set"),
        ("web:Authorization=@env:", "the environment variable '' is not set"),
        ("web:Authorization=@file:/nowhere/key", "cannot read '/nowhere/key'"),
    ],
)
def test_a_bad_header_is_refused_naming_the_flag_never_the_value(
    header: str, named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    error = refused([*SERVERS, "--header", header], capsys)
    assert named in error
    assert SECRET not in error


def test_a_header_given_twice_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    twice = ["--header", f"web:X-Key={SECRET}", "--header", f"web:x-key={SECRET}"]
    error = refused([*SERVERS, *twice], capsys)
    assert "--header: web:x-key: given twice" in error
    assert SECRET not in error


def test_header_values_come_as_written_from_the_environment_or_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WEB_KEY", f"Bearer {SECRET}")
    (tmp_path / "key").write_text(f"{SECRET}-file\n")
    parser = command._gateway_parser()
    options = parser.parse_args(
        [*SERVERS, "--header", "web:Authorization=@env:WEB_KEY",
         "--header", f"web:X-Key=@file:{tmp_path / 'key'}", "--header", "web:X-Team=blue team"]
    )  # fmt: skip
    [web, files] = with_headers(options.servers, options.headers)
    assert web.headers == (
        ("Authorization", f"Bearer {SECRET}"),
        ("X-Key", f"{SECRET}-file"),
        ("X-Team", "blue team"),
    )
    assert files.headers == ()
    assert SECRET not in repr(options)  # the namespace, its upstreams and headers
    assert SECRET not in repr(web)


def test_the_help_shows_how_to_keep_a_secret_off_the_command_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        cli(["--listen", "h:9", "--help"])
    shown = capsys.readouterr().out
    assert "--header NAME:HEADER=VALUE" in shown
    assert "@env:VAR" in shown
