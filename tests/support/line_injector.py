"""An exception injected at the n-th line diskreplay executes (``sys.settrace``): every
point at which Ctrl-C or a signal handler's exception could cut an operation short."""
import os
import sys

import diskreplay

PACKAGE_DIR = os.path.dirname(diskreplay.__file__)


class LineInjector:
    """Counts line events in diskreplay's frames; raises ``exc`` at the ``at``-th one."""

    def __init__(self, at=None, exc=KeyboardInterrupt):
        self.at, self.exc, self.lines, self.functions = at, exc, 0, set()

    def _local(self, frame, event, arg):
        if event == "line":
            self.lines += 1
            self.functions.add((os.path.basename(frame.f_code.co_filename), frame.f_code.co_name))
            if self.lines == self.at:
                raise self.exc("injected")
        return self._local

    def _global(self, frame, event, arg):
        if frame.f_code.co_filename.startswith(PACKAGE_DIR):
            return self._local
        return None

    def run(self, fn):
        sys.settrace(self._global)
        try:
            fn()
        finally:
            sys.settrace(None)
