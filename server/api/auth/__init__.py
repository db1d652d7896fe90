"""Who is calling: tokens, browser sessions and their ends, the same-origin check, rate limits."""
