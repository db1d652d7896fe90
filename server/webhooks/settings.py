"""The `webhooks` world setting: checked, masked on the way out, restored when a client sends `•••` back."""
from __future__ import annotations

import hashlib
from typing import Any
from urllib.parse import urlsplit

from ..redact import remember_secret

MASK = "•••"  # as MCP secrets (server/tools/mcp/masking.py)
SUBJECTS = ("request", "decision", "timeout", "escalation")  # what a webhook may be sent
FORMATS = ("json", "slack")
MAX_WEBHOOKS = 10
MAX_URL = 2048
MAX_SECRET = 256
_FIELDS = {"url", "format", "secret", "events", "allow_private"}


def check_webhooks(value: object) -> list[dict[str, Any]]:
    """The setting as stored: each entry complete (`format`, `secret`, `events`, `allow_private`); a
    `ValueError` saying what is wrong otherwise."""
    if not isinstance(value, list) or len(value) > MAX_WEBHOOKS:
        raise ValueError(f"webhooks must be a list of at most {MAX_WEBHOOKS} objects")
    checked: list[dict[str, Any]] = []
    seen: dict[tuple[str, str], int] = {}  # (url, format) -> index: the pair names a webhook (`hook_id`)
    for n, hook in enumerate(value):
        where = f"webhooks[{n}]"
        if not isinstance(hook, dict):
            raise ValueError(f"{where} must be an object with a url")
        if unknown := set(hook) - _FIELDS:
            raise ValueError(f"{where} has unknown fields: {', '.join(sorted(unknown))}")
        url = hook.get("url")
        if not isinstance(url, str) or len(url) > MAX_URL:
            raise ValueError(f"{where}.url must be an http(s) URL of at most {MAX_URL} characters")
        if url != MASK:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"{where}.url must be an http(s) URL with a host")
        kind = hook.get("format", "json")
        if kind not in FORMATS:
            raise ValueError(f"{where}.format must be one of {', '.join(FORMATS)}")
        if (url, kind) in seen:  # they would share one id, one delivery claim: only one would be sent
            raise ValueError(f"{where} has the url and format of webhooks[{seen[(url, kind)]}]: one webhook "
                             "per URL and format, with every event it should get")
        seen[(url, kind)] = n
        secret = hook.get("secret")
        if secret is not None and (not isinstance(secret, str) or not 0 < len(secret) <= MAX_SECRET):
            raise ValueError(f"{where}.secret must be a string of 1 to {MAX_SECRET} characters, or absent")
        subjects = hook.get("events", list(SUBJECTS))
        if not isinstance(subjects, list) or not subjects or any(s not in SUBJECTS for s in subjects):
            raise ValueError(f"{where}.events must be a non-empty list of {', '.join(SUBJECTS)}")
        allow_private = hook.get("allow_private", False)
        if not isinstance(allow_private, bool):
            raise ValueError(f"{where}.allow_private must be true or false")
        checked.append({"url": url, "format": kind, "secret": secret, "events": list(dict.fromkeys(subjects)),
                        "allow_private": allow_private})
    return checked


def masked_webhooks(hooks: object) -> object:
    """The setting as clients see it, the owner too: `url` and `secret` are write-only, and `id` names the
    stored webhook a `•••` sent back stands for."""
    if not isinstance(hooks, list):
        return hooks
    return [{**h, "id": hook_id(h), "url": MASK, **({"secret": MASK} if h.get("secret") else {})}
            if isinstance(h, dict) else h for h in hooks]


def restore_webhooks(hooks: object, stored: object) -> object:
    """`hooks` with each `•••` back to the value stored in the webhook its `id` names (a `ValueError` when
    there is none). By id, not by position: a list sent back without one of its entries would otherwise
    give the next webhook the removed one's URL and secret."""
    if not isinstance(hooks, list):
        return hooks
    old = {hook_id(h): h for h in stored if isinstance(h, dict)} if isinstance(stored, list) else {}
    out: list[object] = []
    for n, hook in enumerate(hooks):
        if isinstance(hook, dict):
            hook = dict(hook)
            key = hook.pop("id", None)
            was = old.get(key) if isinstance(key, str) else None
            for field in ("url", "secret"):
                if hook.get(field) == MASK:
                    kept = was.get(field) if was is not None else None
                    if not kept:
                        raise ValueError(f"webhooks[{n}].{field} is {MASK} but has no stored value: send the "
                                         "value, or the webhook's id as the settings show it")
                    hook[field] = kept
        out.append(hook)
    return out


def remember_webhook_secrets(settings: dict[str, Any]) -> None:
    """Each webhook's URL and secret hidden wherever shown from now on (server/redact.py)."""
    for hook in settings.get("webhooks") or ():
        if isinstance(hook, dict):
            for field in ("url", "secret"):
                if isinstance(hook.get(field), str) and hook[field] != MASK:
                    remember_secret(hook[field])


def hook_id(hook: dict[str, Any]) -> str:
    """A webhook's name in claims and outcomes: the same in every process, and no part of its URL."""
    return hashlib.sha256(f"{hook['url']}\n{hook.get('format')}".encode()).hexdigest()[:12]


def target_host(url: str) -> str:
    """All of a URL an outcome shows: its host (the path of a Slack or similar URL is the secret)."""
    return urlsplit(url).hostname or "?"
