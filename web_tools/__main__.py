"""``python -m web_tools serve ...``: a user error prints one line and exits 2."""

import sys

from mia.errors import MiaError
from web_tools.cli import main

try:
    main(sys.argv[1:])
except MiaError as err:
    print(f"web_tools: error: {err}", file=sys.stderr)
    raise SystemExit(err.exit_code) from None
except KeyboardInterrupt:
    raise SystemExit(130) from None
