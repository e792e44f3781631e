"""`python -m tools.scale`: see tools/scale/run.py."""

from tools.scale.run import main

raise SystemExit(main())
