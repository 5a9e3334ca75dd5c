"""genready's development tooling: the simulator, the demo, a private systemd user manager and the
test/bench harness. Not part of the daemon: nothing in `genready` imports this package, except the
CLI's `simulate` and `demo` subcommands, and only when one of them runs (see docs/architecture.md)."""
