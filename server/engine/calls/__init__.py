"""Tool calls: run exactly once, their records, and writes retried while storage fails."""
