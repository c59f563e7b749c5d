"""A dlbridge.Function as an op of torch's compiler (see dlbridge._compiled)."""


def call(fn, args):
    """Call Function ``fn`` on ``args`` (parameter order) while tracing."""
    raise TypeError(f"{fn.name}(): a dlbridge Function cannot be called "
                    f"inside torch's compiler yet")
