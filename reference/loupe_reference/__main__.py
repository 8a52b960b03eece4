import sys

from loupe_reference.cli import main

sys.exit(main())
