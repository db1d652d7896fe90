"""AG-UI: a world's chats for frontends built on the AG-UI protocol."""
