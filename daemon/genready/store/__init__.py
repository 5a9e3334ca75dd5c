"""What genready keeps on disk: the start records (storage the rule reads, not the rule itself), and
the one way every file genready writes is made durable (durable)."""
