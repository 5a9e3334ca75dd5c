"""The LLM servers genready knows: one ServerKind each (kinds.py), and their cache flushes (flush.py)."""
