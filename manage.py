#!/usr/bin/env python3
"""Django's command-line utility for administrative tasks."""

import sys


def main() -> None:
    from config.startup import settings_or_exit

    settings_or_exit()  # a variable that does not parse: its one sentence, status 2
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
