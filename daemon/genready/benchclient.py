"""`python3 -m genready.benchclient`: the entry point units and plans name; the client lives in tools/."""

import sys

from genready.tools.benchclient import main

if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
