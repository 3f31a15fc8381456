"""The reference's module name ``mneme.async_executor``: the same module as :mod:`replay_server.client.executor`.

Kept so that scripts written for the reference run unchanged; mneme's own code imports :mod:`replay_server.client.executor`.
"""

import sys

from replay_server.client import executor as _module

sys.modules[__name__] = _module
