"""Integer helpers shared by the scheduler, the cost meter, the strategies, the pools and the kernels.

Each is plain Python where Python calls it and is compiled inline where a Numba-compiled function calls it
(`register_jitable`), so a compiled loop and the Python code it mirrors state the rule once.
"""

from numba.extending import register_jitable


@register_jitable
def cdiv(a, b):
    """Ceiling of a / b for integers (b > 0), or elementwise for integer arrays: the blocks that `a` tokens occupy."""
    return -(-a // b)
