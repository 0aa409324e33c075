"""Integer helpers shared by the scheduler, the cost meter and the strategies."""


def cdiv(a: int, b: int) -> int:
    """Ceiling of a / b for integers (b > 0): the blocks that `a` tokens occupy."""
    return -(-a // b)
