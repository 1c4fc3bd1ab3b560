"""What bench/plot.py and bench/targets.py share about `qmm bench --json` files."""
import math


def positive(value):
    """A finite number > 0 as a bench file writes one: an int below 2^53 (a float holds it exactly; a larger one,
    e.g. 10**400, has no float) or a finite float; not a bool (JSON true is no time)."""
    return (type(value) is int and 0 < value < 2**53) or (type(value) is float and math.isfinite(value) and value > 0)


def show(value):
    """A value for a message: its repr, cut to 40 characters."""
    r = repr(value)
    return r if len(r) <= 40 else r[:37] + "..."
