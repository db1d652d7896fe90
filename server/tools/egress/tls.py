"""The server name (SNI) a TLS ClientHello asks for, read without decrypting anything: a tunnel's
bytes must go to the host its CONNECT named, not to another one a shared address also serves.

A ClientHello may come a byte at a time, and may span several TLS records (a handshake message is
cut into records as the sender likes): it is reassembled from consecutive handshake records up to the
length its own header gives, and read only when whole."""
from __future__ import annotations

RECORD_LIMIT = 5 + 16 * 1024 + 2048  # a TLS record's header and its largest body
HELLO_LIMIT = 64 * 1024  # the largest ClientHello read (post-quantum key shares make them a few KiB)


def could_be_tls(first: bytes) -> bool:
    """Whether a tunnel's first bytes start, or may still start, a TLS handshake record."""
    return bool(first) and first[0] == 0x16 and (len(first) < 2 or first[1] == 0x03)


def is_tls(first: bytes) -> bool:
    """Whether a tunnel's first bytes start a TLS handshake record."""
    return len(first) >= 3 and first[0] == 0x16 and first[1] == 0x03


def record_length(first: bytes) -> int | None:
    """The whole first record's length once its header is in (None before)."""
    return 5 + int.from_bytes(first[3:5], "big") if len(first) >= 5 else None


def handshake_message(data: bytes) -> bytes | None:
    """The first handshake message (its 4-byte header and body) of the handshake records `data` starts
    with, or None while more bytes are needed. Raises ValueError for anything else: another kind of
    record before it is whole, an empty or oversized record, a message longer than HELLO_LIMIT."""
    message = bytearray()
    at = 0
    while True:
        if len(data) < at + 5:
            return None
        if data[at] != 0x16 or data[at + 1] != 0x03:
            raise ValueError("a TLS handshake interrupted by another kind of record")
        size = int.from_bytes(data[at + 3:at + 5], "big")
        if not 0 < size <= RECORD_LIMIT - 5:
            raise ValueError("a TLS record of a length no sender uses")
        if len(data) < at + 5 + size:
            return None
        message += data[at + 5:at + 5 + size]
        at += 5 + size
        if len(message) >= 4:
            whole = 4 + int.from_bytes(message[1:4], "big")
            if whole > HELLO_LIMIT:
                raise ValueError(f"a TLS hello longer than {HELLO_LIMIT} bytes")
            if len(message) >= whole:
                return bytes(message[:whole])


def server_name(data: bytes) -> str | None:
    """The host_name of a ClientHello's server_name extension (lower case), or None when it has none.
    `data`: the tunnel's first bytes, the whole hello in them. Raises ValueError when they do not hold
    a whole, well-formed ClientHello."""
    message = handshake_message(data)
    if message is None:
        raise ValueError("a truncated ClientHello")
    try:
        if message[0] != 0x01:
            raise ValueError("not a ClientHello")
        body = message[4:]
        at = 2 + 32  # version, random
        at += 1 + body[at]  # session id
        at += 2 + int.from_bytes(body[at:at + 2], "big")  # cipher suites
        at += 1 + body[at]  # compression methods
        if at == len(body):
            return None  # no extensions
        end = at + 2 + int.from_bytes(body[at:at + 2], "big")
        if end != len(body):
            raise ValueError("a ClientHello whose extensions do not fill it")
        at += 2
        while at + 4 <= end:
            kind, size = int.from_bytes(body[at:at + 2], "big"), int.from_bytes(body[at + 2:at + 4], "big")
            at += 4
            if kind == 0:  # server_name: a list of (type, length, name); type 0 is host_name
                names = body[at + 2:at + size]
                while len(names) >= 3:
                    length = int.from_bytes(names[1:3], "big")
                    if names[0] == 0:
                        return names[3:3 + length].decode("ascii").lower().removesuffix(".")
                    names = names[3 + length:]
                raise ValueError("a server_name extension without a host name")
            at += size
        return None
    except (IndexError, UnicodeDecodeError):
        raise ValueError("a truncated or malformed ClientHello") from None
