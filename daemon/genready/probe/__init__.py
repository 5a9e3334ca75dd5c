"""Asking the server, and proving who answered."""
