"""What genready keeps on disk and how it touches files: the start records (storage the rule reads,
not the rule itself), the one way every file genready writes is made durable (durable), and the one
bounded reader of files it is pointed at (bounded)."""
