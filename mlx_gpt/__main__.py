"""`python -m mlx_gpt ...` is `python -m qkstudy ...` (its commands run with either backend)."""

import sys

from qkstudy.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
