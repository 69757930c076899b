"""``python -m ng_otel.cli``: the same as the ``ng-otel`` command."""

import sys

from ng_otel.cli import main

sys.exit(main())
