"""Integer helpers shared by the scheduler, the cost meter, the strategies, the pools and the kernels."""


def cdiv(a, b):
    """Ceiling of a / b for integers (b > 0), or elementwise for integer arrays: the blocks that `a` tokens occupy."""
    return -(-a // b)
