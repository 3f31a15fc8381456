"""The reference's module name ``mneme.recorded_execution``: the same module as :mod:`mneme.recording.execution`.

Kept so that scripts written for the reference run unchanged; mneme's own code imports :mod:`mneme.recording.execution`.
"""

import sys

from mneme.recording import execution as _module

sys.modules[__name__] = _module
