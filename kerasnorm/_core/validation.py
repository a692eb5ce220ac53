"""Argument checks shared by the layers. Errors name the argument and value."""

import numbers


def check_positive_number(value, name):
    """Return `value` as a float; it must be a real number > 0."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0:
        raise ValueError(
            f"`{name}` must be a number greater than 0. Received: {name}={value!r}"
        )
    return float(value)


def check_epsilon(epsilon, name="epsilon"):
    """Return `epsilon` as a float; it must be a real number > 0."""
    return check_positive_number(epsilon, name)


def check_positive_int(value, name):
    """Return `value`; it must be an int >= 1 (bools are rejected)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(
            f"The argument `{name}` must be a positive integer. "
            f"Received: {name}={value!r}"
        )
    return int(value)


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_groups(value, name="groups"):
    """Return `value`: a positive int, or -1 (one group per channel, the
    sentinel Keras' and TensorFlow Addons' GroupNormalization accept)."""
    if _is_int(value) and value == -1:
        return -1
    return check_positive_int(value, name)


class AxisTypeError(TypeError, ValueError):
    """An `axis` that is neither an int nor a list/tuple.

    A TypeError, as Keras' normalization layers raise (worded as theirs, so
    code and tests written against them catch it), and a ValueError, as every
    other bad argument here raises, so that one `except ValueError` still
    covers all of them (numpy's `AxisError` is likewise both a ValueError and
    an IndexError).
    """


def check_axis(axis, name="axis", *, allow_list=True):
    """Return `axis` as an int or a list of ints.

    Bounds are checked at build time, when the input rank is known. Raises a
    TypeError for a value that is neither an int nor a list/tuple, and a
    ValueError for an empty list, a list holding something else than ints,
    or a list where only an int is allowed.
    """
    if _is_int(axis):
        return int(axis)
    is_list = isinstance(axis, (list, tuple))
    if allow_list and is_list and axis:
        if all(_is_int(a) for a in axis):
            return [int(a) for a in axis]
    expected = "an int or a non-empty list of ints" if allow_list else "an int"
    if not is_list:
        kinds = "an int or a list/tuple of ints" if allow_list else "an int"
        raise AxisTypeError(
            f"Expected {kinds} for the argument '{name}'. `{name}` must be "
            f"{expected}. Received: {name}={axis!r}"
        )
    raise ValueError(f"`{name}` must be {expected}. Received: {name}={axis!r}")


def check_rate(value, name):
    """Return `value` as a float; it must be a number in [0, 1) (a dropout rate)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not 0.0 <= value < 1.0
    ):
        raise ValueError(
            f"`{name}` must be a number in [0, 1). Received: {name}={value!r}"
        )
    return float(value)


def check_choice(value, choices, name):
    """Return `value`; it must be one of `choices`."""
    if value not in choices:
        raise ValueError(
            f"`{name}` must be one of {tuple(choices)}. Received: {name}={value!r}"
        )
    return value
