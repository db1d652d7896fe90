"""Test helpers that ship with the server: doubles of external services."""
