"""LLM providers: they talk to a model and return data. They know nothing of the log or the bus."""
from .base import LLMError, Provider, Reply, ToolCall

__all__ = ["LLMError", "Provider", "Reply", "ToolCall"]
