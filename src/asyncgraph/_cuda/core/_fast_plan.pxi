# What the compiled fast path works from (included by _core_compiled.pyx before _fast.pxi): its
# plans as C arrays (CPlan) and their guards (_fits), the fast job, and the histograms it keeps
# in C. Its plans are learned as _fast_plan.FastPlan first.
#
# It changes the front's objects only through their owners' operations, which it cimports (their
# modules are compiled from their Python source, each with a .pxd declaring its types): the
# scheduler's FastDoor (admit_launched, withdraw, complete_launched), the resident store's
# is_live, track_uses, untrack and readers (writer_of, readers_of, storage_of), and the pending
# result's new_pending and set_outcome.

import asyncio as _asyncio
import importlib.machinery as _machinery
import os as _os
import sys as _sys

import numpy as _np

from asyncgraph._buffers._resident cimport (
    ResidentBuffer, readers_of, storage_of, track_uses, untrack, writer_of
)
from asyncgraph._jobs._pending cimport new_pending, set_outcome
from asyncgraph._runtime._exceptions import AllocationError as _AllocationError
from asyncgraph._runtime._finished import Download as _Download
from asyncgraph._front._lifecycle import OPEN as _OPEN
from asyncgraph._runtime._priority import NORMAL as _NORMAL_OBJ
from asyncgraph._runtime._priority import PRIORITIES as _PRIORITIES
from asyncgraph._args._plan_cache import same_dims as _same_dims
from asyncgraph._jobs._scheduler import JobState as _JobState
from asyncgraph._runtime._telemetry import BUCKET_BOUNDS as _BUCKET_BOUNDS
from asyncgraph._cuda.driver._driver import error_for as _error_for
from ._fast_plan import K_IN, K_IN_OUT, K_INTO, K_OUT, K_RESIDENT, K_SCALAR
from ._fast_plan import MAX_PLANS as _MAX_PLANS
from ._fast_plan import RING_BYTES
from ._fast_plan import FastPlan as _FastPlan
from ._fast_plan import describes as _describes
from ._fast_plan import eligible as _eligible


def _owners_compiled():
    """Raise unless each module cimported above is its compiled build (of the same source, built
    with this core): a plain Python module of the same name would be read as the wrong layout."""
    for name in ("asyncgraph._buffers._resident", "asyncgraph._jobs._pending",
                 "asyncgraph._jobs._fast_door"):
        loader = getattr(_sys.modules[name], "__loader__", None)
        if not isinstance(loader, _machinery.ExtensionFileLoader):
            raise TypeError(f"{name} is not compiled (the compiled core calls it through C)")


_owners_compiled()

cdef enum:
    MAX_DIMS = 8
    N_BUCKETS = 201

# The argument codes of a plan: the argument kinds' (``_arguments.FAST_CODES``, by way of
# ``_fast_plan``), read once here; the staged ones lie right above A_SCALAR (``<= A_OUT``).
cdef int A_SCALAR = K_SCALAR
cdef int A_IN = K_IN
cdef int A_IN_OUT = K_IN_OUT
cdef int A_OUT = K_OUT
cdef int A_RESIDENT = K_RESIDENT
cdef int A_INTO = K_INTO


def fast_codes():
    """The argument codes this core's fast path compares, by the names of ``_arguments.FAST_CODES``
    (a test checks they are the table's)."""
    return {
        "scalar": A_SCALAR,
        "in": A_IN,
        "in_out": A_IN_OUT,
        "out": A_OUT,
        "resident": A_RESIDENT,
        "into": A_INTO,
    }

cdef object _LAUNCHED = _JobState.LAUNCHED
cdef object _DONE = _JobState.DONE
cdef object _running_loop = _asyncio._get_running_loop
cdef object _NEVER = "never"
cdef int _NORMAL = _NORMAL_OBJ  # the default class's rank
if len(_PRIORITIES) != N_CLASSES:  # the fast path's per-class arrays are this long
    raise ImportError(f"the compiled core counts {N_CLASSES} priority classes, not {len(_PRIORITIES)}")
cdef object _AUTO = "auto"
cdef object _ndarray = _np.ndarray
cdef object _EMPTY = ()
cdef uint64_t _RING = RING_BYTES
cdef int _OOM = <int>cydriver.CUDA_ERROR_OUT_OF_MEMORY
cdef double _BOUNDS[N_BUCKETS]
for _i, _bound in enumerate(_BUCKET_BOUNDS):
    _BOUNDS[_i] = _bound


cdef extern from "Python.h":
    PyObject* PyThreadState_GetDict()
    PyObject* PyDict_GetItem(PyObject* mapping, PyObject* key)

cdef object _RUNNING_KEY = "__asyncio_running_event_loop__"
cdef long _forks = 0  # forks this process came out of (as the child)


def _count_fork():
    global _forks
    _forks += 1


_os.register_at_fork(after_in_child=_count_fork)


cdef inline bint _runs_here(FastPath path, object loop) except -1:
    """Whether *loop* is the event loop running on this thread, as ``asyncio`` says (the
    question the Python core asks), asked once per running of the loop.

    ``asyncio._get_running_loop()`` costs a ``getpid()`` on Python 3.11 (about 0.25 us on the
    stand-in's machine). Its answer depends only on what ``asyncio`` keeps for the thread under
    ``__asyncio_running_event_loop__`` in the thread's dictionary (Python 3.11: a holder of the
    loop and the pid, made anew each time a loop starts or stops running; 3.12: the loop) and on
    the process. So once it said *loop* runs here, the answer stands while that object is the
    one kept (held here, so its identity is not reused) and the process has not forked. A loop's
    ``_thread_id`` is no such answer: it matches inside a second loop run within it, as
    nest_asyncio runs one, and in a child forked from its thread, where no loop runs. Where
    nothing is kept there (Python 3.13, where the question costs nothing), ``asyncio`` is asked
    each time."""
    cdef PyObject* state = PyThreadState_GetDict()
    cdef PyObject* kept = NULL
    if state != NULL:
        kept = PyDict_GetItem(state, <PyObject*>_RUNNING_KEY)
    if (
        kept != NULL
        and kept != <PyObject*>None
        and kept == <PyObject*>path._here
        and path._here_forks == _forks
    ):
        return True
    if _running_loop() is not loop:
        return False
    if kept != NULL and kept != <PyObject*>None:
        path._here = <object>kept
        path._here_forks = _forks
    return True


cdef inline void _record_value(HistogramC* h, double value) noexcept:
    """Sort *value* into the telemetry's buckets (``Histogram``'s: the first bucket whose
    upper bound is at least the value; NaN in the last)."""
    cdef int lo = 0, hi = N_BUCKETS - 1, mid
    while lo < hi:
        mid = (lo + hi) >> 1
        if _BOUNDS[mid] >= value:
            hi = mid
        else:
            lo = mid + 1
    h.counts[lo] += 1
    h.count += 1
    h.total += value
    if value < h.low:
        h.low = value
    if value > h.high:
        h.high = value


cdef inline void _clear(HistogramC* h) noexcept:
    memset(h, 0, sizeof(HistogramC))
    h.low = float("inf")


cdef _flush_histogram(HistogramC* h, histogram):
    if h.count:
        histogram.add_counts(
            [h.counts[i] for i in range(N_BUCKETS)], h.count, h.total, h.low, h.high
        )
        _clear(h)


cdef inline object _into(object out):
    """``out.into`` of an ``Out``."""
    return out.into


cdef object _ELSEWHERE = object()


cdef inline object _lane_of(object use):
    """The lane a buffer's unfinished *use* runs on; ``None`` if it finished (or there is
    none); ``_ELSEWHERE`` if the fast path cannot order after it (a download, or a use not
    launched yet)."""
    if use is None:
        return None
    if type(use) is FastJob:
        if (<FastJob>use).state is _DONE or (<FastJob>use).gpu_done:
            return None
        if (<FastJob>use)._event is None:
            return _ELSEWHERE
        return (<FastJob>use).lane
    if type(use) is _Download:
        return _ELSEWHERE
    if use.state is _DONE or use.gpu_done:
        return None
    if use.event is None:
        return _ELSEWHERE  # not launched yet
    return use.lane


cdef class FastJob(WatchItem):
    """A dispatch the fast path launched: its job in the scheduler, and its own watch in the
    reactor (no ``callback``: ``FastPath._complete`` completes it). It has what the rest of
    the backend reads of a job (``state``, ``event``, ``lane``, ``gpu_done``, ``pending``,
    ``call``, ``buffers``...), so a later dispatch on the general path orders itself after it
    like after any other."""

    deps = ()
    nvtx_range = None
    timing = False
    streamed = False
    replay = None
    device_buffer = None
    t_submit = 0.0

    @property
    def plan(self):
        """The :class:`~asyncgraph._cuda.core._fast_plan.FastPlan` it was launched by."""
        return self.cplan.plan if self.cplan is not None else None

    def __repr__(self):
        return f"<FastJob #{self.id} {self.call.kernel.name!r} {self.state.value}>"


cdef class CPlan:
    """A :class:`~asyncgraph._cuda.core._fast_plan.FastPlan` in C arrays."""

    def __dealloc__(self):
        free(self.args)
        free(self.returned)
        free(self.residents)

    def __init__(self, plan):
        cdef ArgC* a
        cdef ResultC* r
        cdef Py_ssize_t i, k
        self.plan = plan
        self.keep = []
        self.template = plan.template
        self.name = plan.name
        self.grid_key = plan.grid
        self.block_key = plan.block
        for k in range(3):
            self.grid[k] = plan.grid_dims[k]
            self.block[k] = plan.block_dims[k]
        self.shared_mem = plan.shared_mem
        self.in_end, self.up_end, self.total = plan.in_end, plan.up_end, plan.total
        self.up_copy = plan.up_copy
        self.staged = plan.staged
        self.writes = tuple(plan.writes)
        self.n_args = plan.n_args
        self.args = <ArgC*>calloc(self.n_args if self.n_args else 1, sizeof(ArgC))
        self.n_returned = len(plan.returned)
        self.returned = <ResultC*>calloc(self.n_returned if self.n_returned else 1, sizeof(ResultC))
        self.n_residents = len(plan.residents)
        self.residents = <Py_ssize_t*>calloc(
            self.n_residents if self.n_residents else 1, sizeof(Py_ssize_t)
        )
        if self.args == NULL or self.returned == NULL or self.residents == NULL:
            raise MemoryError("no memory for a fast plan")
        for i, (code, kind, shape, dtype, strides, offset) in enumerate(plan.args):
            a = &self.args[i]
            a.kind = code
            a.type = self._hold(kind)
            a.offset = offset
            if dtype is not None:
                a.dtype = self._hold(dtype)
            if code == A_OUT:
                a.shape = self._hold(shape)
            elif code == A_IN or code == A_IN_OUT:
                if len(shape) > MAX_DIMS:
                    raise ValueError(f"{len(shape)} dimensions: more than the fast path keeps")
                a.ndim = len(shape)
                for k in range(a.ndim):
                    a.dims[k] = shape[k]
                    a.strides[k] = strides[k]
        for index, offset, nbytes, in_out in plan.uploads:
            self.args[index].nbytes = nbytes
            self.has_uploads = True
        for k, (index, written, into) in enumerate(plan.residents):
            self.residents[k] = index
            self.args[index].write = written
        for k, (code, index, offset, nbytes, dtype, shape) in enumerate(plan.returned):
            r = &self.returned[k]
            r.kind = code
            r.index = index
            r.offset = offset
            r.nbytes = nbytes
            r.dtype = self._hold(dtype)
            r.type_num = dtype.num
            if len(shape) > MAX_DIMS:
                raise ValueError(f"{len(shape)} dimensions: more than the fast path keeps")
            r.ndim = len(shape)
            for i in range(r.ndim):
                r.dims[i] = shape[i]

    cdef PyObject* _hold(self, value):
        self.keep.append(value)
        return <PyObject*>value


cdef class KnownKernel:
    """What the fast path knows of one kernel: its launcher once loaded, its plans, and
    whether ``graph="auto"`` steered one of them (most recently learned plans first, at most
    ``MAX_PLANS``)."""

    def __init__(self):
        self.launcher = None
        self.plans = []
        self.steered = False

    @staticmethod
    def of(dict kernels, kernel):
        """What *kernels* knows of *kernel*, made empty if nothing yet."""
        known = kernels.get(kernel)
        if known is None:
            known = kernels[kernel] = KnownKernel()
        return known

    def learn(self, plan):
        """Launch calls of *plan* (a :class:`CPlan`) too (a few plans are kept)."""
        self.plans.insert(0, plan)
        del self.plans[_MAX_PLANS:]



cdef bint _fits(CPlan plan, tuple args, object grid, object block, object shared_mem) except -1:
    """Whether *args* and the launch shape pass *plan*'s guards (a Plan's, exactly)."""
    cdef Py_ssize_t i, n = plan.n_args
    cdef ArgC* a
    cdef object value, array, kind_of, dtype
    cdef cnp.ndarray arr
    cdef int kind
    if len(args) != n or type(shared_mem) is not int or shared_mem != plan.shared_mem:
        return False
    if (grid != plan.grid_key or type(grid) is not int) and not _same_dims(grid, plan.grid_key):
        return False
    if (block != plan.block_key or type(block) is not int) and not _same_dims(
        block, plan.block_key
    ):
        return False
    for i in range(n):
        a = &plan.args[i]
        value = args[i]
        kind_of = type(value)
        if <PyObject*>kind_of != a.type:
            return False
        kind = a.kind
        if kind == A_SCALAR:
            continue
        if kind == A_IN:
            array = value
        elif kind == A_IN_OUT:
            array = value.array
            if type(array) is not _ndarray:
                return False
        elif kind == A_OUT:
            if value.into is not None or value.resident or value.shape != <object>a.shape:
                return False
            dtype = value.dtype
            if <PyObject*>dtype != a.dtype:
                return False
            continue
        elif kind == A_RESIDENT:
            dtype = value.dtype
            if <PyObject*>dtype != a.dtype:
                return False
            continue
        else:  # A_INTO
            dtype = value.dtype
            if value.into is None or <PyObject*>dtype != a.dtype:
                return False
            continue
        arr = <cnp.ndarray>array
        if cnp.PyArray_NDIM(arr) != a.ndim or <PyObject*>cnp.PyArray_DESCR(arr) != a.dtype:
            return False
        if memcmp(cnp.PyArray_DIMS(arr), a.dims, a.ndim * sizeof(Py_ssize_t)) != 0:
            return False
        if memcmp(cnp.PyArray_STRIDES(arr), a.strides, a.ndim * sizeof(Py_ssize_t)) != 0:
            return False
    return True
