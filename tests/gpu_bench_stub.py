"""A point's benchmark for tests/test_gpu_daemon.py: notes that it ran (argv[1]), writes a bench
client's line into {out} (argv[2]), and runs for 1.5 s."""

import json
import sys
import time

with open(sys.argv[1], "a") as f:
    f.write("ran\n")
with open(f"{sys.argv[2]}/bench.jsonl", "w") as f:
    f.write(json.dumps({"output_tokens": 5000, "output_tokens_per_second": 100.0}) + "\n")
time.sleep(1.5)  # the run itself: long enough for two GPU samples a second apart
