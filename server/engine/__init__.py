"""The world engine: worlds, agents, routing, LLM turns, tool calls and approvals, all derived from the log."""
