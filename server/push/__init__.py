"""Web Push (issue #32 item 1): VAPID keys, people's subscriptions, and the sender that tells them of requests."""
