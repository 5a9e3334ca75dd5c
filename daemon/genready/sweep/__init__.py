"""`genready sweep`: benchmark runs pinned to verified starts, laid out as the loop runs.

A sweep runs a plan's points (run/) and leaves files: DIR/results.jsonl (a line per attempt), each run's
{out}/bench.jsonl (its bench client's line) and DIR/search.jsonl (what each load search found). A report
(report/) reads those files back. The two sides meet only at the files (files.py) and the row (rows.py),
beside the plan they both read: run/ imports nothing of report/, report/ nothing of run/. One point's
attempt, in order (run/runner.py, Sweep._attempt): strays waited out, the instance reused or started and
verified, strays again, the engine's configuration confirmed (a verdict), the warmup and the flush, the
command run (with its GPU cost and the server's counters), the drafting verdict; then Sweep.tries writes
its results line, once, whole.

    main                `genready sweep` and `sweep restore`: the CLI's entry points; --resume, --dry-run, the summary
    plan                PLAN.toml parsed: its templates, points, groups of one server configuration
    plankeys            PLAN.toml's top-level keys, each defined once: what it takes, its default, its help, its reader
    replay              `sweep replay`: the schedule proven in one more load, a plan of the sweep's run into DIR/replay
    search              the plan's [search] table and a load search's decisions, as pure functions
    budget              the plan's `budget`: the unit's load history, the stop rule, what the report says it left
    explore             the plan's `strategy` over server configurations: the grid, or a pattern search (pure)
    crossover           where a configuration's speedup over the baseline falls below 1 along a load search
    files               the files both sides share: their names, JSON Lines, a run's bench line
    rows                a report's row, one shape for all: Figure, FIGURES, Row, row_of, point_row, mark_best
    noise               the statistics both sides use: Student's t, Ratio and its interval, the spread between loads

    run.runner          the loop: configurations, points, repeats, attempts, each attempt's steps in order; signals
    run.order           which groups load, in order: the grid's schedule, or a search's loads; DIR/explore.jsonl
    run.baseline        where the plan's baseline runs: its rounds among the groups, at every client setting
    run.noisecheck      noise_check: the A/A start's loads before anything else, and what they measured, on stderr
    run.autorepeat      repeats = "auto": another run only while the point's interval overlaps the leader's
    run.prune           what a failed start prunes, and the stop after failed starts in a row
    run.budgetrun       the budget while the sweep runs and in --dry-run: the history read, the estimate, the check
    run.strays          GPU strays: asked of the daemon, waited out before a load and before a run
    run.dropin          the drop-in's lifecycle on the unit, from check to restore
    run.steps           an attempt's steps as values: a Verified instance or NotReady; warm and flush; the command
    run.confirm         the engine's own report against its flags and the plan's `expect`: a verdict, before the run
    run.gpucost         each run's GPU cost, sampled while its command runs
    run.searchrun       a plan's [search] per server configuration: its steps, each a run; DIR/search.jsonl
    run.results         results.jsonl: each attempt's line and fingerprint; the one store of what is known per point
    run.lines           what the sweep says on stderr while it runs, and the ETA

    report.main         `genready sweep report`: the folders read once, one report in the asked format
    report.collect      results folders into rows: one per point and configuration, best marked, ratios attached
    report.table        the rows as text (a table, CSV, markdown, JSON) with its legend; the sweep's summary
    report.speedup      ratios against the baseline with their 95 % interval, and the drift check
    report.decision     the Decision: per client setting the best configuration or none, its speedup, the SLO judged
    report.schedule     --schedule: the speculation depth per load, in vLLM's or SGLang's own format
    report.replay       the replay's verdict: per load the schedule over the best static, a regression below 0.90x
    report.categories   the category x configuration tables: accept length and speedup per prompt category
    report.outputs      each point's answers against the baseline's, prompt by prompt: match, prefix, loops, marks
    report.slower       who gets slower: per-prompt speedups, the share slower with its interval, by category
    report.heatmap      the speedup heatmap over two server axes
    report.html         `--format html`: one self-contained page, its plots drawn by matplotlib
    report.plotrules    what keeps every plot of the page readable
    report.loadreport   the load search's section: steps, found values, crossovers, their plots
    report.compare      `--compare`: two sweeps' points side by side, each figure's change
"""
