"""The reference's module name ``mneme.tuning.sample_strategy``: the same module as :mod:`tuner.strategies.sample_strategy`.

Kept so that scripts written for the reference run unchanged; mneme's own code imports :mod:`tuner.strategies.sample_strategy`.
"""

import sys

from tuner.strategies import sample_strategy as _module

sys.modules[__name__] = _module
