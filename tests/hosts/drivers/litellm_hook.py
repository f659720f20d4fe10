"""The module a LiteLLM proxy config names in its host test (copied beside config.yaml as
`ratewarden_hook.py`): the ratewarden callback, and a `custom_auth` standing for the
proxy's virtual keys (which need a database) so the test runs without one.

Each key is authenticated here as LiteLLM authenticates a virtual key, to a
`UserAPIKeyAuth` with the key's `user_id` (or only a `key_alias`); the service key's user
is named in `end_user_keys`, so its requests' `user` field names the ratewarden user.
"""

from __future__ import annotations

from typing import Any

from fastapi import HTTPException
from litellm.proxy._types import UserAPIKeyAuth  # type: ignore[import-not-found,unused-ignore]

from ratewarden.integrations.litellm import RatewardenCallback

KEYS: dict[str, dict[str, Any]] = {
    "sk-alice": {"user_id": "alice", "team_id": "red"},
    "sk-bob": {"user_id": "bob"},
    "sk-erin": {"user_id": "erin"},
    "sk-frank": {"user_id": "frank"},
    "sk-gwen": {"user_id": "gwen"},
    "sk-judy": {"user_id": "judy"},
    "sk-kim": {"user_id": "kim"},
    "sk-ops": {"key_alias": "ops-dashboard"},  # a key without a user: its alias
    "sk-support": {"user_id": "support-bot"},  # a service that authenticates its users
}

handler = RatewardenCallback(end_user_keys=["support-bot"])


async def user_api_key_auth(request: Any, api_key: str) -> UserAPIKeyAuth:
    found = KEYS.get(api_key.removeprefix("Bearer ").strip())
    if found is None:
        raise HTTPException(status_code=401, detail="unknown key")
    return UserAPIKeyAuth(api_key=api_key, token=f"hashed-{api_key[-4:]}", **found)
