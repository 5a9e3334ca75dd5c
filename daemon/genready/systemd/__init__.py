"""The only place that talks to systemd (pystemd)."""
