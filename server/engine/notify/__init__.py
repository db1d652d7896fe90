"""Telling people beyond the page: outgoing webhooks (webhooks.py) and escalation of waiting requests
(escalation.py), with a hook for other channels (web push) to hear escalations."""
