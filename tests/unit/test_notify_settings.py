"""The notification settings refused by name: `serve` says which variable is wrong (a
setting without a flag is named as its environment variable), and starts nothing."""

from __future__ import annotations

import pytest

from ratewarden.cli import main
from ratewarden.service.settings import Settings

BAD = [
    ("RATEWARDEN_WEBHOOK_URL", "ftp://hooks.example/x", "starts with https:// or http://"),
    ("RATEWARDEN_WEBHOOK_URL", "https://", "names a host"),
    ("RATEWARDEN_WEBHOOK_URL", "https://a b/", "no spaces"),
    ("RATEWARDEN_WEBHOOK_URL", "https://h.example/" + "x" * 3000, "at most 2048"),
    ("RATEWARDEN_WEBHOOK_SECRET", "a\x01b", "printable"),
    ("RATEWARDEN_NOTIFY_QUEUE", "0", "greater than or equal to 1"),
    ("RATEWARDEN_NOTIFY_QUEUE", "lots", "valid integer"),
    ("RATEWARDEN_WEBHOOK_ATTEMPTS", "21", "less than or equal to 20"),
    ("RATEWARDEN_WEBHOOK_TIMEOUT_S", "0", "greater than 0"),
    ("RATEWARDEN_WEBHOOK_TIMEOUT_S", "nan", "less than or equal to 60"),
]


@pytest.mark.parametrize(("name", "value", "words"), BAD, ids=[f"{b[0]}={b[2]}" for b in BAD])
def test_a_bad_notification_setting_is_refused_naming_its_variable(
    name: str,
    value: str,
    words: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(name, value)
    assert main(["serve", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ratewarden: {name}: "), err
    assert words in err
    assert "Value error" not in err


def test_empty_webhook_settings_are_unset() -> None:
    settings = Settings(webhook_url="  ", webhook_secret="")
    assert (settings.webhook_url, settings.webhook_secret) == (None, None)
