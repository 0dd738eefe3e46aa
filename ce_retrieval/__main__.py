import sys

from ce_retrieval.cli import main

sys.exit(main())
