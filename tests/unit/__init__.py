"""Pure logic and single parts on their own: LLM input, redaction, rule matching, events, tools and their sandbox."""
