"""An exception injected at the n-th line diskreplay executes (``sys.settrace``): every
point at which Ctrl-C or a signal handler's exception could cut an operation short."""
import os
import sys

import diskreplay

PACKAGE_DIR = os.path.dirname(diskreplay.__file__)


class LineInjector:
    """Counts line events in diskreplay's frames; raises ``exc`` at the ``at``-th one."""

    def __init__(self, at=None, exc=KeyboardInterrupt, files=None, before=None):
        """``files``: count (and inject at) only lines of these source files (absolute
        paths), e.g. one part's modules; default: every file of the package. ``before``:
        called (untraced) at the ``at``-th line before ``exc`` is raised there, as a signal
        handler would (the README's: ``buf.close()``, then ``sys.exit``)."""
        self.at, self.exc, self.lines, self.functions = at, exc, 0, set()
        self.files = None if files is None else set(files)
        self.before = before

    def _local(self, frame, event, arg):
        if event == "line":
            self.lines += 1
            self.functions.add((os.path.basename(frame.f_code.co_filename), frame.f_code.co_name))
            if self.lines == self.at:
                if self.before is not None:
                    self.before()
                raise self.exc("injected")
        return self._local

    def _global(self, frame, event, arg):
        name = frame.f_code.co_filename
        if name.startswith(PACKAGE_DIR) and (self.files is None or name in self.files):
            return self._local
        return None

    def run(self, fn):
        sys.settrace(self._global)
        try:
            fn()
        finally:
            sys.settrace(None)
