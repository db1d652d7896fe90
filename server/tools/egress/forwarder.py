"""Runs first in a sandbox of the `ask` network mode (as `python3 -I -S -c SOURCE SOCKET PORT COMMAND...`):
listens on the sandbox's own 127.0.0.1:PORT, then runs COMMAND in its place, while a forked child
relays each connection to the proxy's Unix socket, byte for byte. The sandbox has no other way out.
Standard library only, and short: it is passed as source text, and starts before every command."""
import os
import socket
import sys
import threading


def _relay(a: socket.socket, b: socket.socket) -> None:
    try:
        while data := a.recv(65536):
            b.sendall(data)
        b.shutdown(socket.SHUT_WR)
    except OSError:
        a.close()
        b.close()


def _serve(listener: socket.socket, path: str) -> None:
    while True:
        client, _ = listener.accept()
        proxy = socket.socket(socket.AF_UNIX)
        try:
            proxy.connect(path)
        except OSError:
            client.close()
            proxy.close()
            continue
        for a, b in ((client, proxy), (proxy, client)):
            threading.Thread(target=_relay, args=(a, b), daemon=True).start()


def main() -> None:
    path, port, command = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    listener = socket.create_server(("127.0.0.1", port))
    if os.fork() == 0:  # the relay: quiet, and gone with the sandbox (its first process ends them all)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        _serve(listener, path)
    listener.close()
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
