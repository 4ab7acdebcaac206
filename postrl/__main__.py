import sys

from postrl.cli import main

sys.exit(main())
