"""The app in process (Starlette's TestClient): pages, fragments, routes, access rules. Fast."""
