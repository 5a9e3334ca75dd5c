"""Jobs built on the rule, run by the CLI (never by the daemon): the sweep and its reports, the
bench client and what it sends, `genready init`, and `check-config --probe`'s pre-flight probe."""
