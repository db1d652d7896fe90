"""Outgoing webhooks (docs/notifications.md): their settings, target checks, signatures and payloads.

Nothing here touches the log: the engine's side (claims, retries, outcomes) is server/engine/notify/."""
