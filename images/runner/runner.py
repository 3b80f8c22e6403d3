"""The container's entry point (``python3 -I -S /opt/sandboxd/runner.py``): the runner package
``sandboxd_runner`` and the sandbox contract ``sandboxd.protocol`` are installed beside this
file, which ``-I`` leaves off ``sys.path``."""

import sys

sys.path.insert(0, __file__.rpartition("/")[0])

from sandboxd_runner.main import main

sys.exit(main())
