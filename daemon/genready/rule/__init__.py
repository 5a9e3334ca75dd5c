"""What "ready" means, and the memory of starts."""
