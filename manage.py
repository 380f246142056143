#!/usr/bin/env python
"""Django's command-line utility for decisionflow.

Start-up failures (no SECRET_KEY, no database, unapplied migrations, a closed pipe) print one
line on stderr and exit with a documented code (docs/COMMANDS.md); add --traceback to see the
traceback.
"""

import os
import sys


def main():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "decisionflow.settings")
    from core.commandline import execute_from_command_line

    sys.exit(execute_from_command_line(sys.argv))


if __name__ == "__main__":
    main()
