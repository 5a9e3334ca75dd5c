"""`genready sweep`: benchmark runs pinned to verified starts, laid out as the loop runs.

    plan      PLAN.toml: its keys (defined once), points, groups of one server configuration
    main      the CLI's entry points: `sweep`, `sweep restore`, `sweep report`; --resume, --dry-run
    runner    the loop: configurations, points, repeats, attempts; signals; the summary
    steps     one attempt's steps, values in and out: a Verified instance or NotReady, then the command
    dropin    the drop-in's lifecycle on the unit, from check to restore
    prune     what a failed start prunes (the plan's prune axes), and the stop after failed starts in a row
    results   results.jsonl, each line's fingerprint, and the one store of what is known per point
    lines     what the sweep says while it runs, and the ETA
    report, html, compare    `sweep report` in its formats
"""
