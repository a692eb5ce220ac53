"""Private math shared by every kerasnorm layer (not public API)."""

from kerasnorm._core.normalization import broadcast_shape
from kerasnorm._core.normalization import compute_stats
from kerasnorm._core.normalization import normalize
from kerasnorm._core.normalization import normalize_axes
from kerasnorm._core.normalization import reshape_target
from kerasnorm._core.normalization import stats_dtype
from kerasnorm._core.validation import check_axis
from kerasnorm._core.validation import check_choice
from kerasnorm._core.validation import check_epsilon
from kerasnorm._core.validation import check_groups
from kerasnorm._core.validation import check_positive_int
from kerasnorm._core.validation import check_positive_number
from kerasnorm._core.validation import check_rate

__all__ = [
    "broadcast_shape",
    "check_axis",
    "check_choice",
    "check_epsilon",
    "check_groups",
    "check_positive_int",
    "check_positive_number",
    "check_rate",
    "compute_stats",
    "normalize",
    "normalize_axes",
    "reshape_target",
    "stats_dtype",
]
