"""The policy's `notifications:` section: compiled as written, each bad field refused by
`policy check` with an error naming it, and warnings for what only the daemon's
environment can tell (a variable not set) or what nobody could verify (no secret)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ratewarden.cli import main
from ratewarden.policy import PolicyError, parse_policy
from ratewarden.policy.model import Notifications
from ratewarden.vocabulary import NotifyEvent

HEAD = """\
version: 1
rules:
  - name: daily
    budget: 10/day
    soft_limit: 80%
"""


def section(text: str) -> bytes:
    return (HEAD + "notifications:\n" + text).encode()


def test_no_section_is_no_webhook_and_the_default_refusal_threshold() -> None:
    policy = parse_policy(HEAD.encode())
    assert policy.notifications == Notifications((), 10, 600_000)
    assert "notifications" not in policy.document  # GET /v1/policy shows what the file says


def test_a_section_compiles_as_written(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOOK_SECRET", "s3cret")
    policy = parse_policy(
        section(
            "  repeated_refusals: {more_than: 3, within: 90s}\n"
            "  webhooks:\n"
            "    - url: https://hooks.example.com/a\n"
            "      secret_env: HOOK_SECRET\n"
            "      events: [budget.exhausted]\n"
            "    - url_env: SLACK_URL\n"
        )
    )
    first, second = policy.notifications.webhooks
    assert (first.url, first.secret_env, first.events) == (
        "https://hooks.example.com/a",
        "HOOK_SECRET",
        frozenset({"budget.exhausted"}),
    )
    assert (second.url, second.url_env, second.events) == (
        None,
        "SLACK_URL",
        frozenset(map(str, NotifyEvent)),
    )
    assert (policy.notifications.refusals_over, policy.notifications.refusals_window_ms) == (
        3,
        90_000,
    )
    assert "s3cret" not in str(policy.document)  # the file names variables, never secrets


BAD = [
    ("  webhooks: [{url: 'ftp://x.example/a'}]\n", "notifications.webhooks[0].url", "https://"),
    ("  webhooks: [{url: 'https://'}]\n", "notifications.webhooks[0].url", "names a host"),
    ("  webhooks: [{url: 'https://x.example:99999/'}]\n", "webhooks[0].url", "not a URL"),
    ('  webhooks: [{url: "https://x.example/\\u0007"}]\n', "webhooks[0].url", "control"),
    ("  webhooks: [{url: 'https://a b.example/'}]\n", "webhooks[0].url", "spaces"),
    (f"  webhooks: [{{url: 'https://x.example/{'a' * 3000}'}}]\n", "webhooks[0].url", "2048"),
    ("  webhooks: [{url: 12}]\n", "notifications.webhooks[0].url", "string"),
    ("  webhooks: [{url: 'https://u:p@x.example/'}]\n", "webhooks[0].url", "url_env"),
    ("  webhooks: [{}]\n", "notifications.webhooks[0]", "exactly one of url, url_env"),
    (
        "  webhooks: [{url: 'https://x.example/', url_env: U}]\n",
        "notifications.webhooks[0]",
        "exactly one of url, url_env",
    ),
    ("  webhooks: [{url_env: '1X'}]\n", "notifications.webhooks[0].url_env", "environment"),
    ("  webhooks: [{url_env: U, secret_env: 'A-B'}]\n", "webhooks[0].secret_env", "environment"),
    ("  webhooks: [{url_env: U, events: [budget.gone]}]\n", "webhooks[0].events[0]", "budget"),
    ("  webhooks: [{url_env: U, events: []}]\n", "notifications.webhooks[0].events", "at least"),
    (
        "  webhooks: [{url_env: U, events: [budget.exhausted, budget.exhausted]}]\n",
        "notifications.webhooks[0].events",
        "twice",
    ),
    ("  webhooks: [{url_env: U, secret: abc}]\n", "notifications.webhooks[0].secret", "unknown"),
    ("  webhooks: " + str([{"url_env": "U"}] * 17) + "\n", "notifications.webhooks", "16"),
    ("  repeated_refusals: {more_than: 0}\n", "repeated_refusals.more_than", "greater"),
    ("  repeated_refusals: {more_than: true}\n", "repeated_refusals.more_than", "integer"),
    ("  repeated_refusals: {more_than: 2.5}\n", "repeated_refusals.more_than", "integer"),
    ("  repeated_refusals: {within: soon}\n", "repeated_refusals.within", "duration"),
    ("  repeated_refusals: {within: 0s}\n", "repeated_refusals.within", "duration"),
    ("  repeated_refusals: {within: 8d}\n", "repeated_refusals.within", "at most 7d"),
    ("  sms: yes\n", "notifications.sms", "unknown field"),
]


@pytest.mark.parametrize(("text", "field", "words"), BAD, ids=[b[1] + ":" + b[2] for b in BAD])
def test_each_bad_field_is_an_error_naming_it(
    text: str, field: str, words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(PolicyError) as raised:
        parse_policy(section(text))
    assert any(field in issue.field and words in issue.message for issue in raised.value.issues), [
        (i.field, i.message) for i in raised.value.issues
    ]
    path = tmp_path / "policy.yaml"
    path.write_bytes(section(text))
    assert main(["policy", "check", str(path)]) == 1
    assert field in capsys.readouterr().err


def test_policy_check_warns_of_unset_variables_and_unsigned_webhooks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RW_TEST_UNSET_URL", raising=False)
    monkeypatch.setenv("RW_TEST_SECRET", "x")
    path = tmp_path / "policy.yaml"
    path.write_bytes(
        section(
            "  webhooks:\n"
            "    - url: https://hooks.example.com/a\n"
            "    - url_env: RW_TEST_UNSET_URL\n"
            "      secret_env: RW_TEST_SECRET\n"
        )
    )
    assert main(["policy", "check", str(path)]) == 0  # warnings: the file can be used
    err = capsys.readouterr().err
    assert "notifications.webhooks[0] has no secret_env" in err
    assert "notifications.webhooks[1].url_env: $RW_TEST_UNSET_URL is not set here" in err
    assert "RW_TEST_SECRET" not in err  # set: nothing to say


def test_a_policy_reads_its_attributes_by_slot() -> None:
    """A Policy's attributes are read on every decision: slotted, each is read by index
    however many it has (service/metrics.py, MAX_ATTRIBUTES, says why a dict's number
    mattered). The section is a property, not a field, all the same."""
    from ratewarden.policy import load_example_policy

    for policy in (parse_policy(section("  webhooks: [{url_env: U}]\n")), load_example_policy()):
        assert not hasattr(policy, "__dict__")
        assert "notifications" not in type(policy).__slots__
