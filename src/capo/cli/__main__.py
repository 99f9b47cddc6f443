import sys

from capo.cli import main

sys.exit(main())
