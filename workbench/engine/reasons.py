"""Why the engine rejects a request: the words after "rejected: " in requests.parquet's status, kept in
one place for every loop that rejects (the general one and `compiled_paged`)."""

OUTGROWS_POOL = "needs more KV slots than the whole pool"
ABOVE_WATERMARK = "needs more KV blocks than the pool holds above the watermark"


def too_long(total_tokens: int, max_model_len: int) -> str:
    return f"prompt+output ({total_tokens}) > max_model_len ({max_model_len})"


def stuck(now_s: float, waiting: int, swapped: int) -> str:
    """The error of a run whose step loop found work left that can never run (`rules.step_verdict`)."""
    return f"scheduler stuck at t = {now_s:.6g} s: {waiting} waiting, {swapped} swapped, nothing running or admissible"
