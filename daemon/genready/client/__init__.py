"""The CLI's side of the daemon."""
