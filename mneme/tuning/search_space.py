"""The reference's module name ``mneme.tuning.search_space``: the same module as :mod:`tuner.space.search_space`.

Kept so that scripts written for the reference run unchanged; mneme's own code imports :mod:`tuner.space.search_space`.
"""

import sys

from tuner.space import search_space as _module

sys.modules[__name__] = _module
