"""A key the server makes once and keeps in its data folder, readable by this user only (0600)."""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def read_or_make(path: Path, make: Callable[[], bytes]) -> bytes:
    """The file's bytes, made with `make()` if it does not exist yet (blocking: call it in a thread)."""
    try:  # O_EXCL: of two processes racing on one folder, one makes it and both read it
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "wb") as out:
            out.write(make())
    os.chmod(path, 0o600)  # tighten one copied in by hand
    return path.read_bytes()
