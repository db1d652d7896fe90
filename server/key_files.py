"""A key the server makes once and keeps in its data folder, readable by this user only (0600)."""
from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def read_or_make(path: Path, make: Callable[[], bytes]) -> bytes:
    """The file's bytes, made with `make()` if it does not exist yet (blocking: call it in a thread)."""
    if not path.exists():
        # Written whole to a file of its own, then linked into place: a crash (or a failing `make`) never
        # leaves an empty key, and of two processes racing on one folder, one's key wins and both read it.
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")  # 0600
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(make())
                out.flush()
                os.fsync(out.fileno())
            try:
                os.link(temporary, path)
            except FileExistsError:
                pass
        finally:
            os.unlink(temporary)
    os.chmod(path, 0o600)  # tighten one copied in by hand
    return path.read_bytes()
