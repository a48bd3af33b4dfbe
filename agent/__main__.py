"""`python -m agent`: the same as the llmgw-agent console script."""

import sys

from agent.cli import main

sys.exit(main())
