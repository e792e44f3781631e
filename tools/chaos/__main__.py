"""`python -m tools.chaos`: the harness's command line (see tools/chaos/run.py)."""

from tools.chaos.run import main

raise SystemExit(main())
