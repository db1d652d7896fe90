"""What every reader of events needs."""
from __future__ import annotations

from ..vocab import Event

# -- reading -----------------------------------------------------------------------------------------------

def request_id(event: Event) -> str:
    """The id of the one `client.*` call of a server request (an approval's id, a question's id)."""
    return str(event["tool_calls"][0]["id"])
