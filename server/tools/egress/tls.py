"""The server name (SNI) a TLS ClientHello asks for, read without decrypting anything: a tunnel's
bytes must go to the host its CONNECT named, not to another one a shared address also serves."""
from __future__ import annotations

RECORD_LIMIT = 5 + 16 * 1024 + 2048  # a TLS record's header and its largest body


def is_tls(first: bytes) -> bool:
    """Whether a tunnel's first bytes start a TLS handshake record."""
    return len(first) >= 3 and first[0] == 0x16 and first[1] == 0x03


def record_length(first: bytes) -> int | None:
    """The whole first record's length once its header is in (None before)."""
    return 5 + int.from_bytes(first[3:5], "big") if len(first) >= 5 else None


def server_name(record: bytes) -> str | None:
    """The host_name of a ClientHello's server_name extension (lower case), or None when it has none.
    Raises ValueError when the record is not a well-formed ClientHello."""
    try:
        if record[0] != 0x16 or record[5] != 0x01:  # handshake record, ClientHello
            raise ValueError("not a ClientHello")
        body = record[9:5 + int.from_bytes(record[3:5], "big")]
        at = 2 + 32  # version, random
        at += 1 + body[at]  # session id
        at += 2 + int.from_bytes(body[at:at + 2], "big")  # cipher suites
        at += 1 + body[at]  # compression methods
        if at == len(body):
            return None  # no extensions
        end = at + 2 + int.from_bytes(body[at:at + 2], "big")
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
