"""The daemon and its surfaces."""
