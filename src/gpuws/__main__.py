"""``python -m gpuws``: the same entry point as the ``gpuws`` script."""

import sys

from gpuws.cli import main

sys.exit(main())
