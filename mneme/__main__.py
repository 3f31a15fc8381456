import sys

from mneme.cli import main

sys.exit(main())
