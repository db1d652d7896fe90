"""What every event constructor ends with."""
from __future__ import annotations

from typing import Any, cast

from ..vocab import Event


def as_event(event: Any) -> Event:
    """A checked shape as the plain dict the log takes (a TypedDict is one at run time)."""
    return cast(Event, event)
