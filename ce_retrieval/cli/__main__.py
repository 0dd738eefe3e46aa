"""``python -m ce_retrieval.cli COMMAND ...``: the ``ce-retrieval`` command line."""

import sys

from ce_retrieval.cli import main

sys.exit(main())
