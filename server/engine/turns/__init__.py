"""Agents' turns: the runner, what its LLM calls are given and answer, and their dispatch."""
