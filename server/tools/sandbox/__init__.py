"""Tool processes in a bubblewrap sandbox: its mounts, network, users, warm starts and output."""
