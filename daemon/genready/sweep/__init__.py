"""`genready sweep`: benchmark runs pinned to verified starts (see main.py for the loop)."""
