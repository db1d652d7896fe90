"""The server's VAPID key pair (RFC 8292), made once and kept with the server's data.

Embedded mode: `vapid.pem` in the data folder, readable by this user only (0600), like `owner.token`.
Distributed mode: one Redis key of the deployment (`{prefix}:vapid-key`), set by the first process that
needs it; every process signs with the same key, so a subscription made through one is pushed by any.
"""
from __future__ import annotations

import asyncio
import base64
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from ..key_files import read_or_make

KEY_FILE = "vapid.pem"


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class VapidKey:
    """A P-256 private key, and its public half as browsers want it (`applicationServerKey`)."""

    def __init__(self, pem: bytes) -> None:
        key = serialization.load_pem_private_key(pem, password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != "secp256r1":
            raise ValueError("the VAPID key must be a P-256 (secp256r1) private key")
        self.pem = pem
        self.private = key

    @property
    def public(self) -> str:
        """The uncompressed public point, base64url without padding."""
        point = self.private.public_key().public_bytes(serialization.Encoding.X962,
                                                       serialization.PublicFormat.UncompressedPoint)
        return b64url(point)


def new_pem() -> bytes:
    return ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def _file_key(data_dir: Path) -> VapidKey:
    path = data_dir / KEY_FILE
    try:
        return VapidKey(read_or_make(path, new_pem))
    except ValueError as exc:
        raise ValueError(f"{path} does not hold a VAPID key ({exc}): delete it to make a new one "
                         "(every push subscription then has to be made again)") from exc


async def open_key(*, data_dir: Path, redis_url: str | None, redis_prefix: str) -> VapidKey:
    """The deployment's key pair, made on first use."""
    if not redis_url:
        return await asyncio.to_thread(_file_key, Path(data_dir))
    from ..api.auth.sessions import _namespace
    from ..log.redis.connect import connect_redis

    client = await connect_redis(redis_url)
    try:
        key = f"{_namespace(redis_prefix)}:vapid-key"
        await client.set(key, new_pem(), nx=True)  # the first process makes it
        stored = await client.get(key)
        return VapidKey(stored if isinstance(stored, bytes) else str(stored).encode())
    finally:
        await client.aclose()
