"""Real `agent-world serve` processes on loopback: HTTP, sockets, CLI, clients, faults, Redis, sandbox."""
