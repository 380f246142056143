"""`python -m helpdesk`: start the reference helpdesk (helpdesk/README.md)."""

import sys

from helpdesk.server import main

sys.exit(main())
