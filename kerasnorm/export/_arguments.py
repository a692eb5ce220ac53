"""The one keyword for "inputs to check with", and the names it replaced."""

from __future__ import annotations

import warnings

# Default of a deprecated keyword: tells "not given" from an explicit None.
UNSET = object()


def renamed(function, new_name, new, old_name, old):
    """The value of keyword `new_name`, taking the deprecated `old_name` too.

    `verify_inputs` is the name every export function uses for the inputs its
    checks run on; `check_inputs` and `inputs` were the names before it. The
    old name still works and warns.
    """
    if old is UNSET:
        return new
    warnings.warn(
        f"{function}: `{old_name}=` is deprecated; pass `{new_name}=` (the "
        "same inputs; every export function now takes that name).",
        DeprecationWarning,
        stacklevel=3,
    )
    if new is not None:
        raise TypeError(
            f"{function} got both `{new_name}=` and its deprecated alias "
            f"`{old_name}=`; pass `{new_name}=` only."
        )
    return old
