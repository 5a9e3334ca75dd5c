"""What genready keeps on disk: the start records (storage the rule reads, not the rule itself)."""
