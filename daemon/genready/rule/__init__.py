"""What "ready" means: the gate, its schedule, and what it expects from past starts (history)."""
