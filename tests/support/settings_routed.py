"""The test settings with django_jobruns routed to a database of its own ("jobruns").

The default database holds every other app's tables and none of django_jobruns's.
"""

import copy

from tests.support.settings import *  # noqa: F403
from tests.support.settings import DATABASES, VAR_DIR

_default = DATABASES["default"]
_jobruns = copy.deepcopy(_default)
if _default["ENGINE"].endswith("sqlite3"):
    _default["TEST"] = {"NAME": str(VAR_DIR / "test-routed-default.sqlite3")}
    _jobruns["NAME"] = str(VAR_DIR / "routed-jobruns.sqlite3")
    _jobruns["TEST"] = {"NAME": str(VAR_DIR / "test-routed-jobruns.sqlite3")}
else:
    _default["TEST"] = {"NAME": f"test_routed_{_default['NAME']}"}
    _jobruns["TEST"] = {"NAME": f"test_routed_jobruns_{_default['NAME']}"}
DATABASES = {"default": _default, "jobruns": _jobruns}
DATABASE_ROUTERS = ["tests.support.routers.JobRunsRouter"]
