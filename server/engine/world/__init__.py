"""A world's state: its settings, agents, chats, invites, usage, live status and tools."""
