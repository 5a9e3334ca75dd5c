"""Jobs built on the rule: sweeps, the bench client, the pre-flight probe."""
