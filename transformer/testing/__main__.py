"""``python -m transformer.testing``: the kit's command line (:func:`transformer.testing.cli.main`)."""

import sys

from transformer.testing.cli import main

if __name__ == "__main__":
    sys.exit(main())
