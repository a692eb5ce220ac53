"""Old name of `kerasnorm.export.litert`; import that module instead.

Kept only while `tests/helpers.py` still imports `_litert`.
"""

from kerasnorm.export.litert import *  # noqa: F403
