"""The reference's module name ``mneme.mneme_types``: the same module as :mod:`mneme.model.experiment`.

Kept so that scripts written for the reference run unchanged; mneme's own code imports :mod:`mneme.model.experiment`.
"""

import sys

from mneme.model import experiment as _module

sys.modules[__name__] = _module
