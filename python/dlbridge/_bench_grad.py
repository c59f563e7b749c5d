"""Cost of a training step through a dlbridge Function with a vjp: the one
home of the rules behind `dlbridge bench`'s gradient rows
(dlbridge/_bench.py; issue 24 item 7).  Schema and reading: docs/bench.md.

Every route runs the same two C kernels, dlb_kernel_mul_f32 (y = a b) and
dlb_kernel_mul_f32_vjp (da = dy b, db = dy a), of the example library, on
float32[16] tensors (the 3-tensor Function of the issue):

* "train" (torch, eager): one step is `f(a, b).backward(g)` for a and b
  that require grad.  dlbridge: `dlb.load(..., vjp=...)`, one declaration.
  References: the same kernels as plain Functions inside a
  `torch.library.custom_op` with `register_autograd` (torch's documented
  route for a custom kernel), and inside a bare `torch.autograd.Function`
  (the cheapest grad_fn torch has).
* "train-jit": torch, the same step with `f` inside
  `torch.compile(fullgraph=True)` (inductor; forward and backward graphs
  compiled by AOTAutograd), against the custom_op reference compiled alike;
  JAX, `jax.jit(jax.grad(loss))` with loss = sum(f(a, b)), against the same
  kernels as jax-tvm-ffi FFI targets under `jax.custom_vjp` (the peer
  bench/_jax_tvm_peer.cc, built by bench/build_peers.sh).  A JAX step is
  one call of the compiled gradient, dispatch included on both sides.
* "vjp no-grad": the Function with a vjp called on tensors that need no
  gradient, against the same kernel declared without one: what a
  declaration costs the calls that do not train.

Frameworks are passed in, never imported here at import time.
"""

from . import _measure

N = 16
SYMBOL = "dlb_kernel_mul_f32"
VJP_SYMBOL = "dlb_kernel_mul_f32_vjp"
SIGNATURE = "mul(a: float32[n], b: float32[n]) -> (y: float32[n])"
# The references' plain Functions, in the grammar that predates vjp=, so
# they measure on any dlbridge.
PLAIN_SIGNATURE = "mul(a: float32[n], b: float32[n]) -> float32[n]"
VJP_SIGNATURE = ("mul_vjp(a: float32[n], b: float32[n], dy: float32[n]) "
                 "-> (float32[n], float32[n])")
#: The rows' dlbridge side and references, as the table shows them.
DLB_EXPR = {"train": "mul(a, b).backward(g)",
            "train-jit": "mul(a, b).backward(g), compiled",
            ("jax", "train-jit"): "jax.jit(jax.grad(sum of mul))",
            "vjp no-grad": "mul(a, b), a vjp declared"}
REF_EXPR = {("torch", "train", "custom_op"): "custom_op+register_autograd",
            ("torch", "train", "autograd.Function"): "torch.autograd.Function",
            ("torch", "train-jit", "custom_op"): "custom_op+autograd, compiled",
            ("jax", "train-jit", "jax-tvm-ffi"): "jax-tvm-ffi + custom_vjp",
            "no vjp": "mul(a, b), no vjp declared"}
JAX_TVM_FORWARD = "dlbridge_bench_tvm_mul"
JAX_TVM_VJP = "dlbridge_bench_tvm_mul_vjp"


def functions(dlb, kernel):
    """(the Function with its vjp, the forward without one, the vjp kernel
    as a Function of its own) of the kernel library at path `kernel`; the
    first is the text of the error when the declaration fails (the
    references are measured all the same).  Raises when the library or its
    kernels cannot be loaded."""
    plain = dlb.load(kernel, SYMBOL, PLAIN_SIGNATURE)
    vjp = dlb.load(kernel, VJP_SYMBOL, VJP_SIGNATURE)
    try:
        with_vjp = dlb.load(kernel, SYMBOL, SIGNATURE, vjp=VJP_SYMBOL)
    except Exception as e:
        with_vjp = _measure.why(e, 160)
    return with_vjp, plain, vjp


def _case(stmt, fn, **names):
    """A Case timing stmt with fn bound as f, or the error text fn is."""
    return fn if isinstance(fn, str) else _measure.Case(stmt, f=fn, **names)


# ---- torch ------------------------------------------------------------------

def torch_references(torch, plain, vjp, namespace="dlb_bench_grad"):
    """{kind: op(a, b)} for the two torch references over the plain
    Functions: a custom_op with register_autograd, an autograd.Function."""
    @torch.library.custom_op(f"{namespace}::mul", mutates_args=())
    def mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return plain(a, b)

    @mul.register_fake
    def _(a, b):
        return torch.empty_like(a)

    @torch.library.custom_op(f"{namespace}::mul_vjp", mutates_args=())
    def mul_vjp(a: torch.Tensor, b: torch.Tensor,
                dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return tuple(vjp(a, b, dy))

    @mul_vjp.register_fake
    def _(a, b, dy):
        return torch.empty_like(a), torch.empty_like(b)

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    def backward(ctx, dy):
        a, b = ctx.saved_tensors
        return mul_vjp(a, b, dy.contiguous())
    mul.register_autograd(backward, setup_context=setup_context)

    class Mul(torch.autograd.Function):
        @staticmethod
        def forward(a, b):
            return plain(a, b)

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(*inputs)

        @staticmethod
        def backward(ctx, dy):
            a, b = ctx.saved_tensors
            return tuple(vjp(a, b, dy.contiguous()))
    return {"custom_op": mul, "autograd.Function": Mul.apply}


def torch_step(op):
    def step(a, b, g):
        op(a, b).backward(g)
    return step


def torch_leaves(torch):
    """(a, b, g): two float32[N] leaves that require grad, the seed."""
    a = torch.linspace(0.5, 1.5, N).requires_grad_()
    b = torch.linspace(-1.0, 1.0, N).requires_grad_()
    return a, b, torch.ones(N)


def torch_cases(torch, dlb, kernel, backend):
    """{(call, who): _measure.Case or the text of why not} of torch's
    training rows; who is "dlb" or a reference kind.  Compiles what it
    measures."""
    with_vjp, plain, vjp = functions(dlb, kernel)
    refs = torch_references(torch, plain, vjp)
    a, b, g = torch_leaves(torch)
    out = {}
    for who, op in {"dlb": with_vjp, **refs}.items():
        out["train", who] = (op if isinstance(op, str) else
                             _measure.Case("s(a, b, g)", s=torch_step(op),
                                           a=a, b=b, g=g))
    for who, op in (("dlb", with_vjp), ("custom_op", refs["custom_op"])):
        if isinstance(op, str):
            out["train-jit", who] = op
            continue
        compiled = torch.compile(op, backend=backend, fullgraph=True)
        try:
            torch_step(compiled)(a, b, g)  # compiles forward and backward
        except Exception as e:  # reported, not fatal
            out["train-jit", who] = _measure.why(e, 160)
            continue
        out["train-jit", who] = _measure.Case("s(a, b, g)",
                                              s=torch_step(compiled), a=a, b=b, g=g)
    return out


# ---- JAX --------------------------------------------------------------------

def jax_tvm_loss(jax, peer_path):
    """loss(a, b) = sum(mul(a, b)) with mul the jax-tvm-ffi peer's `mul` and
    `mul_vjp` FFI targets under jax.custom_vjp.  Raises when jax_tvm_ffi or
    the peer cannot be loaded."""
    import jax_tvm_ffi
    import tvm_ffi
    module = tvm_ffi.load_module(peer_path)
    jax_tvm_ffi.register_ffi_target(JAX_TVM_FORWARD, module["mul"], platform="cpu")
    jax_tvm_ffi.register_ffi_target(JAX_TVM_VJP, module["mul_vjp"], platform="cpu")

    @jax.custom_vjp
    def mul(a, b):
        return jax.ffi.ffi_call(JAX_TVM_FORWARD, jax.ShapeDtypeStruct(a.shape, a.dtype))(a, b)

    def fwd(a, b):
        return mul(a, b), (a, b)

    def bwd(saved, dy):
        a, b = saved
        out = (jax.ShapeDtypeStruct(a.shape, a.dtype),) * 2
        return tuple(jax.ffi.ffi_call(JAX_TVM_VJP, out)(a, b, dy))
    mul.defvjp(fwd, bwd)
    return lambda a, b: mul(a, b).sum()


def jax_cases(jax, dlb, kernel, peer):
    """{("train-jit", who): Case or why} of JAX's training row: who "dlb" or
    "jax-tvm-ffi" (peer: the report's jax-tvm-ffi peer entry)."""
    import jax.numpy as jnp
    a = jnp.linspace(0.5, 1.5, N, dtype=jnp.float32)
    b = jnp.linspace(-1.0, 1.0, N, dtype=jnp.float32)
    with_vjp = functions(dlb, kernel)[0]
    losses = {"dlb": (with_vjp if isinstance(with_vjp, str)
                      else lambda a, b: with_vjp(a, b).sum())}
    if peer.get("present"):
        try:
            losses["jax-tvm-ffi"] = jax_tvm_loss(jax, peer["path"])
        except Exception as e:
            losses["jax-tvm-ffi"] = _measure.why(e, 160)
    else:
        losses["jax-tvm-ffi"] = peer.get("note", "jax-tvm-ffi: absent")
    out = {}
    for who, loss in losses.items():
        if isinstance(loss, str):
            out["train-jit", who] = loss
            continue
        grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
        try:
            jax.block_until_ready(grad(a, b))  # compiles
        except Exception as e:
            out["train-jit", who] = _measure.why(e, 160)
            continue
        out["train-jit", who] = _measure.Case("r(g(a, b))", r=jax.block_until_ready,
                                              g=grad, a=a, b=b)
    return out


# ---- every framework --------------------------------------------------------

#: The references of each gradient row (besides dlbridge's own side).
REFERENCES = {("torch", "train"): ("custom_op", "autograd.Function"),
              ("torch", "train-jit"): ("custom_op",),
              ("jax", "train-jit"): ("jax-tvm-ffi",)}


def references(fw, call):
    """The sides of row `call` of fw: "dlb", then the reference kinds."""
    return ("dlb",) + REFERENCES.get((fw, call), ("no vjp",))


def cases(fw, dlb, kernel, make, backend, peer):
    """{(call, who): Case or why} of fw's gradient rows: "vjp no-grad" for
    every framework (make(ndarray) -> its tensor), and torch's or JAX's
    training rows.  Raises when the kernels cannot be loaded."""
    import numpy as np
    with_vjp, plain = functions(dlb, kernel)[:2]
    x = make(np.linspace(0.5, 1.5, N, dtype=np.float32))
    y = make(np.linspace(-1.0, 1.0, N, dtype=np.float32))
    out = {("vjp no-grad", "dlb"): _case("f(x, y)", with_vjp, x=x, y=y),
           ("vjp no-grad", "no vjp"): _case("f(x, y)", plain, x=x, y=y)}
    if fw == "torch":
        import torch
        out.update(torch_cases(torch, dlb, kernel, backend))
    elif fw == "jax":
        import jax
        out.update(jax_cases(jax, dlb, kernel, peer))
    return out


def rows(fw, got, side, row):
    """The report's rows of framework fw from measured figures `got`
    ({(call, who): ns or why}); side and row are _bench's builders."""
    out = []
    for (call, who), value in got.items():
        if who == "dlb":
            continue
        label = REF_EXPR.get((fw, call, who)) or REF_EXPR[who]
        ours = DLB_EXPR.get((fw, call)) or DLB_EXPR[call]
        out.append(row(fw, call, side(ours, got[call, "dlb"]), who,
                       side(label, value)))
    return out
