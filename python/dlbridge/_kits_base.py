"""What a framework kit is: the per-framework code `dlbridge doctor` and
`dlbridge bench` run inside their child processes.

A kit knows how to make the framework's tensors (``make``; ``make_cuda`` on
a GPU), the framework's own DLPack importer (``own_importer``), whether a
result can be written through (``writable``), what to hand dlbridge to read
a result back (``exportable``), the framework's own three-tensor operation
for the bench (``op``) and its upstream limitations (``limits``), which the
doctor's judge matches against outcomes.  Everything dlbridge itself decides
about a framework stays in the registry (``_frameworks.REGISTRY``); a kit
holds only what the registry has no use for.

Nothing here imports a framework: each method imports its own, in the child
that calls it.
"""

import importlib.util

# The layouts the doctor probes (float32, shape (4, 6) before slicing).
STRIDED = ("transposed", "step", "negative")     # not compact row-major
LAYOUTS = ("contiguous",) + STRIDED + ("0-d", "size-0", "offset", "read-only")
FP8_DTYPES = ("float8_e4m3fn", "float8_e5m2")


class Unavailable(Exception):
    """Raised by a kit's maker: the producer cannot make this case."""


def storage_dtype(dtype):
    """The NumPy dtype that holds the bits of a doctor dtype."""
    return ("uint16" if dtype == "bfloat16" else
            "uint8" if dtype in FP8_DTYPES else dtype)


def source(np, dtype, layout):
    """The compact NumPy array a case starts from, in the storage dtype:
    small values (0..4) that every dtype holds exactly; the bit patterns 0..4
    for bfloat16 and float8 are small finite numbers, so bytes compare."""
    storage = storage_dtype(dtype)
    if layout == "0-d":
        return np.array(7, dtype=storage)
    base = (np.arange(1, 25) % 5).astype(storage).reshape(4, 6)
    if dtype == "bool":
        base = base.astype(bool)
    return base[:0] if layout == "size-0" else base


def sliced(x, layout, transpose=None):
    """``x`` (anything with NumPy-style slicing) in the case's layout;
    ``transpose`` for frameworks whose transposition is not ``.T``."""
    if layout == "transposed":
        return transpose(x) if transpose else x.T
    # whole index tuples: the array API (array-api-strict) has no
    # NumPy-style partial indexing
    if layout == "step":
        return x[:, ::2]
    if layout == "negative":
        return x[::-1, :]
    if layout == "offset":
        return x[1:, :]
    return x


class Limit:
    """An upstream limitation: the outcomes it explains and why.

    It applies to a probe whose dtype is in ``dtypes`` and layout in
    ``layouts`` (None: any), on ``paths`` ("own", "dlb"), with an outcome in
    ``outcomes`` (None: any but zero-copy), where the framework owning the
    kit plays ``role`` ("consumer", "producer", "either") and the other side
    is ``partner`` (None: any); ``when(cell)`` checks anything else.

    ``read_only``: it applies to read-only sources only (the read-only
    case, and every PyArrow array).

    ``copyable``: the consumer's tensors can hold a copy of such data (a
    layout or read-only limit of its importer, not a dtype it lacks): a
    refusal by dlbridge.convert, which can copy, is then dlbridge's gap.

    ``dlbridge_too``: False for a producer's quirk that the DLPack spec
    allows, which excuses other importers but not dlbridge's."""

    __slots__ = ("reason", "role", "dtypes", "layouts", "paths", "outcomes",
                 "partner", "when", "read_only", "copyable", "dlbridge_too")

    def __init__(self, reason, *, role="consumer", dtypes=None, layouts=None,
                 paths=("own", "dlb"), outcomes=None, partner=None, when=None,
                 read_only=False, copyable=False, dlbridge_too=True):
        self.reason = reason
        self.read_only = read_only
        self.copyable = copyable
        self.dlbridge_too = dlbridge_too
        self.role = role
        self.dtypes = frozenset(dtypes) if dtypes is not None else None
        self.layouts = frozenset(layouts) if layouts is not None else None
        self.paths = frozenset(paths)
        self.outcomes = frozenset(outcomes) if outcomes is not None else None
        self.partner = partner
        self.when = when

    def explains(self, cell, role, partner):
        return ((self.role == "either" or self.role == role)
                and (not self.read_only or cell.get("read_only", False))
                and cell["path"] in self.paths
                and (self.dtypes is None or cell["dtype"] in self.dtypes)
                and (self.layouts is None or cell["layout"] in self.layouts)
                and (self.outcomes is None or cell["outcome"] in self.outcomes)
                and (self.partner is None or self.partner == partner)
                and (self.when is None or self.when(cell)))

    def __repr__(self):
        return f"<Limit {self.reason[:40]!r}>"


class Kit:
    """One framework, as the doctor and the bench use it.  Subclasses set
    the class attributes and override the methods they need."""

    #: the registry's name (``_frameworks.REGISTRY``), shown in rows/columns
    name = None
    #: a shorter name for narrow columns (None: the name)
    short = None
    #: the module ``importlib.util.find_spec`` looks for (None: always there)
    module = None
    #: its distribution (importlib.metadata), when neither the registry's
    #: nor the name
    dist = None
    #: whether it makes CPU tensors / CUDA tensors (``make_cuda``)
    cpu = True
    cuda = False
    #: whether it is a column of the doctor's grids (a consumer: it has a
    #: DLPack importer)
    consumer = True
    #: whether `dlbridge bench` measures it
    bench = False
    #: its own DLPack importer as the reports show it ("{}" is the tensor);
    #: None when it has none, ``no_importer`` saying so
    own_label = None
    no_importer = None
    #: upstream limitations, most specific first (see Limit)
    limits = ()
    #: the bench's reference for convert when it is not own_importer:
    #: (label, callable), built by ``convert_reference``
    convert_label = None

    def installed(self):
        return (self.module is None
                or importlib.util.find_spec(self.module) is not None)

    def load(self):
        """Import the framework (the doctor's children do it first, so that
        frameworks that cannot share a process are found out at once)."""
        if self.module is not None:
            importlib.import_module(self.module)

    def export(self, obj):
        """The producer's own DLPack export of ``obj``, run once after
        making it and dropped: a producer that dies here is at fault,
        whatever the importer."""
        dlpack = getattr(obj, "__dlpack__", None)
        if dlpack is not None:
            try:
                dlpack()
            except Exception:   # a refusal is the importer's to see
                pass

    def make(self, np, a, dtype, layout):
        """(its tensor, the NumPy reference of its logical content) for the
        case: ``a`` is ``source(np, dtype, layout)``.  Raises Unavailable
        when the framework cannot make that case."""
        raise Unavailable(f"{self.name} makes no CPU tensors")

    def make_cuda(self, np, a, dtype, layout):
        raise Unavailable(f"{self.name} makes no CUDA tensors")

    def own_importer(self, dtype="float32"):
        """The framework's own DLPack importer, a callable taking the
        producer's object, for tensors of ``dtype``."""
        raise BufferError(self.no_importer or f"{self.name} has no DLPack importer")

    def writable(self, result):
        """Whether the framework lets its user write into ``result``."""
        return True

    def read_only(self, layout):
        """Whether the tensors it makes for ``layout`` are read-only."""
        return layout == "read-only"

    def exportable(self, obj):
        """What ``dlbridge.from_dlpack`` reads to look at ``obj``'s memory."""
        return obj

    def op(self):
        """The bench's own three-tensor operation: (label, statement over
        a, b, c, the names it uses), or None."""
        return None

    def convert_reference(self):
        """The bench's reference for convert: (label, callable)."""
        return self.own_label.format("y"), self.own_importer()
