"""Real Chromium through Playwright against real servers: the page as people use it."""
