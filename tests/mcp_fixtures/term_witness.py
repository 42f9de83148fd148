"""A process that traps SIGTERM, for the stop-path tests: the marker file shows whether it got its
SIGTERM and grace before anything SIGKILLed it. It never reads stdin (the end of stdin does not
stop it), so only signals end it.

``term_witness.py MARKER WORK [child]``: appends ``ready`` to MARKER at start; on SIGTERM appends
``term``, works WORK seconds, appends ``done`` and exits 0. With ``child``, it first starts one more
witness in its own process group, writing ``MARKER.child``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any


def main() -> None:
    marker, work = sys.argv[1], float(sys.argv[2])

    def note(word: str) -> None:
        with open(marker, "a") as f:
            f.write(word + "\n")

    def on_term(signum: int, frame: Any) -> None:
        note("term")
        time.sleep(work)
        note("done")
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    if sys.argv[3:] == ["child"]:
        subprocess.Popen([sys.executable, __file__, marker + ".child", str(work)], stdin=subprocess.DEVNULL)
    note("ready")
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
