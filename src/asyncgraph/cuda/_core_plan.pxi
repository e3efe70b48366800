# What the compiled fast path works from (included by _core.pyx before _core_fast.pxi): its
# plans as C arrays (CPlan) and their guards (_fits), the fast job, the histograms it keeps in
# C, the mirrors of the front's buffer bookkeeping, and the pending result's slots written at
# their offsets. The twin of _fast_plan.py and _fast_job.py.

import asyncio as _asyncio
import os as _os

import numpy as _np

from .._args import Out as _Out
from .._exceptions import AllocationError as _AllocationError
from .._lifecycle import OPEN as _OPEN
from .._pending import PendingDispatch as _PendingDispatch
from .._pending import set_outcome as _set_outcome
from .._plans import same_dims as _same_dims
from .._resident import Download as _Download
from .._resident import ResidentBuffer as _ResidentBuffer
from .._resident import untrack as _untrack
from .._scheduler import JobState as _JobState
from .._telemetry import BUCKET_BOUNDS as _BUCKET_BOUNDS
from ._driver import error_for as _error_for
from ._fast_plan import K_IN, K_IN_OUT, K_INTO, K_OUT, K_RESIDENT, K_SCALAR
from ._fast_plan import MAX_PLANS as _MAX_PLANS
from ._fast_plan import RING_BYTES
from ._fast_plan import FastPlan as _FastPlan
from ._fast_plan import describes as _describes
from ._fast_plan import eligible as _eligible

cdef enum:
    A_SCALAR = 0
    A_IN = 1
    A_IN_OUT = 2
    A_OUT = 3
    A_RESIDENT = 4
    A_INTO = 5
    MAX_DIMS = 8
    N_BUCKETS = 201

assert (K_SCALAR, K_IN, K_IN_OUT, K_OUT, K_RESIDENT, K_INTO) == (0, 1, 2, 3, 4, 5)

cdef object _LAUNCHED = _JobState.LAUNCHED
cdef object _DONE = _JobState.DONE
cdef object _running_loop = _asyncio._get_running_loop
cdef object _NEVER = "never"
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


# -- mirrors of the front's bookkeeping, for the hot path ----------------------------------------
#
# What these do is the front's (``ResidentStore.is_live``, ``ResidentBuffer._track`` and
# ``_untrack``, ``PendingDispatch.__init__`` and ``set_outcome``); reading and writing the fields
# from C saves a Python call each. The rare cases (a closed buffer's last use, a pending result
# someone waits on) call the front's own functions. tests/test_fast_path.py checks that both
# ways leave the same state.


# Slots of the front's objects (PendingDispatch, ResidentBuffer, Out), read and written at their
# offsets: a generic getattr or setattr by name looks the descriptor up in the type each time,
# and ten of them per dispatch were a tenth of its cost on the stand-in driver. The offsets come
# from the classes' own member descriptors, at import; they are used on objects of exactly that
# class (a subclass may declare a slot of the same name elsewhere).
cdef extern from "Python.h":
    ctypedef struct PyMemberDef:
        Py_ssize_t offset
    ctypedef struct PyMemberDescrObject:
        PyMemberDef* d_member
    void Py_XINCREF(PyObject*)
    void Py_XDECREF(PyObject*)
    bint PyList_CheckExact(PyObject*)
    Py_ssize_t PyList_GET_SIZE(PyObject*)
    PyObject* PyList_GET_ITEM(PyObject*, Py_ssize_t)
    int PyList_SetSlice(PyObject*, Py_ssize_t, Py_ssize_t, PyObject*)
    void PyErr_Clear()


cdef Py_ssize_t _slot(type cls, str name) except -1:
    descriptor = cls.__dict__[name]
    if type(descriptor).__name__ != "member_descriptor":
        raise TypeError(f"{cls.__name__}.{name} is not a slot")
    return (<PyMemberDescrObject*><PyObject*>descriptor).d_member.offset


cdef inline object _get(object obj, Py_ssize_t offset):
    """``obj.<slot at offset>``."""
    cdef PyObject* value = (<PyObject**>((<char*><PyObject*>obj) + offset))[0]
    if value == NULL:
        raise AttributeError(f"a slot of {type(obj).__name__} is not set")
    return <object>value


cdef inline void _put(object obj, Py_ssize_t offset, object value) noexcept:
    """``obj.<slot at offset> = value``."""
    cdef PyObject** field = <PyObject**>((<char*><PyObject*>obj) + offset)
    cdef PyObject* old = field[0]
    Py_INCREF(value)
    field[0] = <PyObject*>value
    Py_XDECREF(old)


cdef Py_ssize_t B_STORE = _slot(_ResidentBuffer, "_store")
cdef Py_ssize_t B_SLOT = _slot(_ResidentBuffer, "_slot")
cdef Py_ssize_t B_GENERATION = _slot(_ResidentBuffer, "_generation")
cdef Py_ssize_t B_IN_USE = _slot(_ResidentBuffer, "_in_use")
cdef Py_ssize_t B_WRITER = _slot(_ResidentBuffer, "_writer")
cdef Py_ssize_t B_READERS = _slot(_ResidentBuffer, "_readers")
cdef Py_ssize_t B_STORAGE = _slot(_ResidentBuffer, "_storage")
cdef Py_ssize_t O_INTO = _slot(_Out, "into")


cdef inline object _into(object out):
    """``out.into`` of an ``Out``."""
    if type(out) is _Out:
        return _get(out, O_INTO)
    return out.into


cdef inline bint _is_live(object store, list generations, list buffers, object buffer) except -1:
    """Whether *buffer* (exactly a ``ResidentBuffer``) is live in *store*, whose generation and
    buffer lists are *generations* and *buffers*."""
    cdef object slot
    if _get(buffer, B_STORE) is not store:
        return False
    slot = _get(buffer, B_SLOT)
    return generations[slot] == _get(buffer, B_GENERATION) and buffers[slot] is buffer


cdef inline PyObject** _field(object obj, Py_ssize_t offset) noexcept:
    return <PyObject**>((<char*><PyObject*>obj) + offset)


cdef inline void _save(object buffer, Saved* saved) noexcept:
    """Keep (with references) the fields of *buffer* that :func:`_track_use` changes."""
    saved.in_use = _field(buffer, B_IN_USE)[0]
    saved.writer = _field(buffer, B_WRITER)[0]
    saved.readers = _field(buffer, B_READERS)[0]
    Py_XINCREF(saved.in_use)
    Py_XINCREF(saved.writer)
    Py_XINCREF(saved.readers)


cdef inline void _forget(Saved* saved) noexcept:
    Py_XDECREF(saved.in_use)
    Py_XDECREF(saved.writer)
    Py_XDECREF(saved.readers)


cdef inline void _move(PyObject** field, PyObject* value) noexcept:
    """Set *field* to *value*, whose reference it takes."""
    cdef PyObject* old = field[0]
    field[0] = value
    Py_XDECREF(old)


cdef inline void _put_back(object buffer, Saved* saved, object use) noexcept:
    """Undo :func:`_track_use` of *use* on *buffer*: its fields as :func:`_save` kept them
    (the references move back), and *use* out of the readers list a read appended it to."""
    cdef PyObject* readers = saved.readers
    cdef Py_ssize_t n
    if readers != NULL and PyList_CheckExact(readers):
        n = PyList_GET_SIZE(readers)
        if n and PyList_GET_ITEM(readers, n - 1) == <PyObject*>use:
            if PyList_SetSlice(readers, n - 1, n, NULL) < 0:
                PyErr_Clear()
    _move(_field(buffer, B_IN_USE), saved.in_use)
    _move(_field(buffer, B_WRITER), saved.writer)
    _move(_field(buffer, B_READERS), readers)


cdef inline int _track_use(object buffer, object use, bint write) except -1:
    """``ResidentBuffer._track`` of *use*, on the fields (``_save`` first, to undo it)."""
    cdef list readers = <list?>_get(buffer, B_READERS)
    _put(buffer, B_IN_USE, _get(buffer, B_IN_USE) + 1)
    if write:
        _put(buffer, B_WRITER, use)
        if len(readers):
            _put(buffer, B_READERS, [])
    else:
        readers.append(use)
    return 0


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


cdef inline int _untrack_use(
    object store, list generations, list buffers, object buffer, object use
) except -1:
    cdef list readers
    if not _is_live(store, generations, buffers, buffer):
        _untrack(buffer, use)  # closed meanwhile: its last use frees it, the front's way
        return 0
    _put(buffer, B_IN_USE, _get(buffer, B_IN_USE) - 1)
    if _get(buffer, B_WRITER) is use:
        _put(buffer, B_WRITER, None)
    else:
        readers = _get(buffer, B_READERS)
        if use in readers:
            readers.remove(use)
    return 0


cdef Py_ssize_t _offset(str name) except -1:
    return _slot(_PendingDispatch, name)


cdef Py_ssize_t P_LOOP = _offset("_loop")
cdef Py_ssize_t P_STATE = _offset("_state")
cdef Py_ssize_t P_OUTCOME = _offset("_outcome")
cdef Py_ssize_t P_WAITERS = _offset("_waiters")
cdef Py_ssize_t P_CALLBACKS = _offset("_callbacks")
cdef Py_ssize_t P_EVENT = _offset("_event")
cdef Py_ssize_t P_DEVICE_TIME = _offset("_device_time")
cdef Py_ssize_t P_SPIN = _offset("_spin")
cdef Py_ssize_t P_ID = _offset("dispatch_id")
cdef Py_ssize_t P_NAME = _offset("kernel_name")
cdef object _STATE_PENDING = 0
cdef object _STATE_DONE = 1
cdef object _STATE_FAILED = 2


cdef inline bint _unset(object pending, Py_ssize_t offset) noexcept:
    """Whether ``pending.<slot at offset>`` is ``None`` (or was never set)."""
    cdef PyObject* value = (<PyObject**>((<char*><PyObject*>pending) + offset))[0]
    return value == NULL or value == <PyObject*>None


cdef inline object _new_pending(object loop, object dispatch_id, object name, object spin):
    cdef object pending = _PendingDispatch.__new__(_PendingDispatch)
    _put(pending, P_LOOP, loop)
    _put(pending, P_STATE, _STATE_PENDING)
    _put(pending, P_OUTCOME, None)
    _put(pending, P_WAITERS, None)
    _put(pending, P_CALLBACKS, None)
    _put(pending, P_EVENT, None)
    _put(pending, P_DEVICE_TIME, None)
    _put(pending, P_SPIN, spin)
    _put(pending, P_ID, dispatch_id)
    _put(pending, P_NAME, name)
    return pending


cdef inline int _resolve(object pending, object outcome) except -1:
    if _unset(pending, P_WAITERS) and _unset(pending, P_CALLBACKS) and _unset(pending, P_EVENT):
        _put(pending, P_OUTCOME, outcome)  # before the state, as set_outcome does
        _put(pending, P_SPIN, None)
        if isinstance(outcome, BaseException):
            pending._traceback = outcome.__traceback__
            _put(pending, P_STATE, _STATE_FAILED)
        else:
            _put(pending, P_STATE, _STATE_DONE)
    else:
        _set_outcome(pending, outcome, None)
    return 0


cdef class FastJob(WatchItem):
    """A dispatch the fast path launched: its job in the scheduler, and its own watch in the
    reactor; see ``_fast_job.FastJob``."""

    deps = ()
    nvtx_range = None
    timing = False
    streamed = False
    replay = None
    device_buffer = None
    t_submit = 0.0

    @property
    def plan(self):
        """The :class:`~asyncgraph.cuda._fast_plan.FastPlan` it was launched by."""
        return self.cplan.plan if self.cplan is not None else None

    def __repr__(self):
        return f"<FastJob #{self.id} {self.call.kernel.name!r} {self.state.value}>"


cdef class CPlan:
    """A :class:`~asyncgraph.cuda._fast_plan.FastPlan` in C arrays."""

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
    whether ``graph="auto"`` steered one of them; see ``_fast_job.KnownKernel``."""

    def __init__(self):
        self.launcher = None
        self.plans = []
        self.steered = False

    def steer(self, call, choice):
        """Set *choice* as ``auto`` of the plans that launch *call*'s signature (at once done
        if one has it already)."""
        cdef CPlan plan
        for candidate in self.plans:
            if (<CPlan>candidate).auto is choice:
                return
        for candidate in self.plans:
            plan = <CPlan>candidate
            if _describes(plan.plan, call):
                plan.auto = choice
                self.steered = True


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
