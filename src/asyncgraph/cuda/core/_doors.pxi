# The front's doors, in C (included by _fast_plan.pxi): the compiled fast path changes the front
# through these alone. Each is a C copy of its owner's operation, of the same name, keeping the
# invariant its owner's docstring states, and uses nothing of the owner's state but what the
# owner lends for it:
#
# - the scheduler's ``FastDoor``: admit_launched, withdraw, complete_launched, on the containers
#   the door exposes (``in_flight``, ``queue``, ``parked``);
# - the resident store's: ``ResidentStore.is_live`` (on the lists ``live_slots`` lends),
#   track_uses, untrack, writer_of, readers_of and storage_of, on the slots of a buffer that
#   ``_resident.BUFFER_FIELDS`` lends;
# - the pending result's: ``PendingDispatch.__init__`` (new_pending) and set_outcome, on the
#   slots ``_pending.PENDING_FIELDS`` lends.
#
# Reading and writing those fields from C saves a Python call each: a generic getattr or setattr
# by name looks the descriptor up in the type each time, and ten of them per dispatch were a
# tenth of its cost on the stand-in driver. The offsets come from the classes' own member
# descriptors, found by the lent names at import (a name that is no slot any more raises here,
# and the Python core is used instead); they are used on objects of exactly that class (a
# subclass may declare a slot of the same name elsewhere). The rare cases (a closed buffer's
# last use, a pending result someone waits on) call the owner's own function.
# tests/test_core_doors.py runs each copy beside its original (through _doors_for_tests, at the
# end) and compares the state they leave; tests/test_fast_path.py runs both cores whole.

from asyncgraph.jobs._pending import PENDING_FIELDS as _PENDING_FIELDS
from asyncgraph.jobs._pending import PENDING_STATES as _PENDING_STATES
from asyncgraph.jobs._pending import PendingDispatch as _PendingDispatch
from asyncgraph.jobs._pending import set_outcome as _set_outcome
from asyncgraph.buffers._resident import BUFFER_FIELDS as _BUFFER_FIELDS
from asyncgraph.buffers._resident import ResidentBuffer as _ResidentBuffer
from asyncgraph.buffers._resident import untrack as _untrack

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


cdef inline PyObject** _field(object obj, Py_ssize_t offset) noexcept:
    return <PyObject**>((<char*><PyObject*>obj) + offset)


cdef inline object _get(object obj, Py_ssize_t offset):
    """``obj.<slot at offset>``."""
    cdef PyObject* value = _field(obj, offset)[0]
    if value == NULL:
        raise AttributeError(f"a slot of {type(obj).__name__} is not set")
    return <object>value


cdef inline void _put(object obj, Py_ssize_t offset, object value) noexcept:
    """``obj.<slot at offset> = value``."""
    cdef PyObject** field = _field(obj, offset)
    cdef PyObject* old = field[0]
    Py_INCREF(value)
    field[0] = <PyObject*>value
    Py_XDECREF(old)


# -- the scheduler's: FastDoor -------------------------------------------------------------------


cdef inline int admit_launched(dict in_flight, FastJob job) except -1:
    """``FastDoor.admit_launched(job)``: *job* admitted straight to ``LAUNCHED``."""
    in_flight[job.id] = job
    job.state = _LAUNCHED
    return 0


cdef inline int withdraw(dict in_flight, FastJob job) except -1:
    """``FastDoor.withdraw(job)``: its admission taken back (a later step raised)."""
    in_flight.pop(job.id, None)
    return 0


cdef inline bint complete_launched(
    dict in_flight, object queue, list parked, FastJob job, object outcome
) except -1:
    """``FastDoor.complete_launched(job, outcome)``: ``DONE``, unless something waits."""
    if len(queue) or len(parked):
        return False
    in_flight.pop(job.id, None)
    job.state = _DONE
    job.outcome = outcome
    return True


# -- the resident store's ------------------------------------------------------------------------

cdef Py_ssize_t B_STORE = _slot(_ResidentBuffer, _BUFFER_FIELDS["store"])
cdef Py_ssize_t B_SLOT = _slot(_ResidentBuffer, _BUFFER_FIELDS["slot"])
cdef Py_ssize_t B_GENERATION = _slot(_ResidentBuffer, _BUFFER_FIELDS["generation"])
cdef Py_ssize_t B_IN_USE = _slot(_ResidentBuffer, _BUFFER_FIELDS["in_use"])
cdef Py_ssize_t B_WRITER = _slot(_ResidentBuffer, _BUFFER_FIELDS["writer"])
cdef Py_ssize_t B_READERS = _slot(_ResidentBuffer, _BUFFER_FIELDS["readers"])
cdef Py_ssize_t B_STORAGE = _slot(_ResidentBuffer, _BUFFER_FIELDS["storage"])


cdef inline bint is_live(object store, list generations, list buffers, object buffer) except -1:
    """``store.is_live(buffer)`` of exactly a ``ResidentBuffer``; *generations* and *buffers*
    are the store's ``live_slots()``."""
    cdef object slot
    if _get(buffer, B_STORE) is not store:
        return False
    slot = _get(buffer, B_SLOT)
    return generations[slot] == _get(buffer, B_GENERATION) and buffers[slot] is buffer


cdef inline object writer_of(object buffer):
    """``writer_of(buffer)``."""
    return _get(buffer, B_WRITER)


cdef inline list readers_of(object buffer):
    """``readers_of(buffer)`` (a ``TypeError`` if the field is no list)."""
    return <list?>_get(buffer, B_READERS)


cdef inline object storage_of(object buffer):
    """``storage_of(buffer)``."""
    return _get(buffer, B_STORAGE)


cdef inline void _save(object buffer, Saved* saved) noexcept:
    """Keep (with references) the fields of *buffer* that :func:`_track` changes."""
    saved.in_use = _field(buffer, B_IN_USE)[0]
    saved.writer = _field(buffer, B_WRITER)[0]
    saved.readers = _field(buffer, B_READERS)[0]
    Py_XINCREF(saved.in_use)
    Py_XINCREF(saved.writer)
    Py_XINCREF(saved.readers)


cdef inline void _move(PyObject** field, PyObject* value) noexcept:
    """Set *field* to *value*, whose reference it takes."""
    cdef PyObject* old = field[0]
    field[0] = value
    Py_XDECREF(old)


cdef inline void _put_back(object buffer, Saved* saved, object use) noexcept:
    """Undo :func:`_track` of *use* on *buffer*: its fields as :func:`_save` kept them (the
    references move back), and *use* out of the readers list a read appended it to."""
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


cdef inline int _track(object buffer, object use, bint write) except -1:
    """``track(buffer, use, write)``, without the earlier uses it returns."""
    cdef list readers = readers_of(buffer)
    _put(buffer, B_IN_USE, _get(buffer, B_IN_USE) + 1)
    if write:
        _put(buffer, B_WRITER, use)
        if len(readers):
            _put(buffer, B_READERS, [])
    else:
        readers.append(use)
    return 0


cdef int track_uses(list buffers, tuple writes, object use) except -1:
    """``track_uses(buffers, writes, use)``: *use* tracked on each of *buffers* (at most 8,
    each exactly a ``ResidentBuffer``), on all or on none."""
    cdef Saved saved[8]
    cdef Py_ssize_t r, n = len(buffers), done = 0
    try:
        for r in range(n):
            _save(buffers[r], &saved[r])
            done = r + 1
            _track(buffers[r], use, writes[r])
    except BaseException:
        for r in range(done - 1, -1, -1):
            _put_back(buffers[r], &saved[r], use)
        raise
    for r in range(done):
        Py_XDECREF(saved[r].in_use)
        Py_XDECREF(saved[r].writer)
        Py_XDECREF(saved[r].readers)
    return 0


cdef inline int untrack(
    object store, list generations, list buffers, object buffer, object use
) except -1:
    """``untrack(buffer, use)`` (the owner's own, for a buffer closed meanwhile: its last use
    frees it)."""
    cdef list readers
    if not is_live(store, generations, buffers, buffer):
        _untrack(buffer, use)
        return 0
    _put(buffer, B_IN_USE, _get(buffer, B_IN_USE) - 1)
    if _get(buffer, B_WRITER) is use:
        _put(buffer, B_WRITER, None)
    else:
        readers = _get(buffer, B_READERS)
        if use in readers:
            readers.remove(use)
    return 0


# -- the pending result's ------------------------------------------------------------------------

cdef Py_ssize_t P_LOOP = _slot(_PendingDispatch, _PENDING_FIELDS["loop"])
cdef Py_ssize_t P_STATE = _slot(_PendingDispatch, _PENDING_FIELDS["state"])
cdef Py_ssize_t P_OUTCOME = _slot(_PendingDispatch, _PENDING_FIELDS["outcome"])
cdef Py_ssize_t P_WAITERS = _slot(_PendingDispatch, _PENDING_FIELDS["waiters"])
cdef Py_ssize_t P_CALLBACKS = _slot(_PendingDispatch, _PENDING_FIELDS["callbacks"])
cdef Py_ssize_t P_EVENT = _slot(_PendingDispatch, _PENDING_FIELDS["event"])
cdef Py_ssize_t P_DEVICE_TIME = _slot(_PendingDispatch, _PENDING_FIELDS["device_time"])
cdef Py_ssize_t P_SPIN = _slot(_PendingDispatch, _PENDING_FIELDS["spin"])
cdef Py_ssize_t P_TRACEBACK = _slot(_PendingDispatch, _PENDING_FIELDS["traceback"])
cdef Py_ssize_t P_ID = _slot(_PendingDispatch, "dispatch_id")
cdef Py_ssize_t P_NAME = _slot(_PendingDispatch, "kernel_name")
cdef object _STATE_PENDING = _PENDING_STATES[0]
cdef object _STATE_DONE = _PENDING_STATES[1]
cdef object _STATE_FAILED = _PENDING_STATES[2]


cdef inline bint _unset(object pending, Py_ssize_t offset) noexcept:
    """Whether ``pending.<slot at offset>`` is ``None`` (or was never set)."""
    cdef PyObject* value = _field(pending, offset)[0]
    return value == NULL or value == <PyObject*>None


cdef inline object new_pending(object loop, object dispatch_id, object name, object spin):
    """``PendingDispatch(loop, dispatch_id, name, spin)``."""
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


cdef inline int set_outcome(object pending, object outcome) except -1:
    """``set_outcome(pending, outcome, None)``: in C while nobody waits on *pending* (no
    awaiter, thread or callback to wake), else the owner's own."""
    if _unset(pending, P_WAITERS) and _unset(pending, P_CALLBACKS) and _unset(pending, P_EVENT):
        _put(pending, P_OUTCOME, outcome)  # before the state, as set_outcome does
        _put(pending, P_SPIN, None)
        if isinstance(outcome, BaseException):
            _put(pending, P_TRACEBACK, outcome.__traceback__)
            _put(pending, P_STATE, _STATE_FAILED)
        else:
            _put(pending, P_STATE, _STATE_DONE)
    else:
        _set_outcome(pending, outcome, None)
    return 0


# -- for the tests alone -------------------------------------------------------------------------


def _doors_for_tests():
    """The C copies above as Python functions taking their originals' parameters, by their
    originals' names, for ``tests/test_core_doors.py``, which runs each beside its original and
    compares what they leave. Nothing else calls them."""

    def track_uses_(list buffers, writes, use):
        if len(buffers) > 8 or any(type(b) is not _ResidentBuffer for b in buffers):
            raise ValueError("the C copy takes at most 8 buffers, each a ResidentBuffer")
        track_uses(buffers, tuple(writes), use)

    def untrack_(buffer, use):
        store = _get(buffer, B_STORE)
        generations, buffers = store.live_slots()
        untrack(store, generations, buffers, buffer, use)

    def is_live_(store, buffer):
        generations, buffers = store.live_slots()
        return is_live(store, generations, buffers, buffer)

    def pending_(loop, dispatch_id, kernel_name, spin=None):
        return new_pending(loop, dispatch_id, kernel_name, spin)

    def set_outcome_(pending, outcome, device_time):
        if device_time is not None:
            raise ValueError("the C copy resolves the fast path's results, which are untimed")
        set_outcome(pending, outcome)

    def admit_launched_(door, FastJob job):
        admit_launched(door.in_flight, job)

    def withdraw_(door, FastJob job):
        withdraw(door.in_flight, job)

    def complete_launched_(door, FastJob job, outcome):
        return complete_launched(door.in_flight, door.queue, door.parked, job, outcome)

    def fast_job_(job_id, state):
        job = FastJob.__new__(FastJob)
        job.id = job_id
        job.state = state
        return job

    return {
        "FastJob": fast_job_,
        "admit_launched": admit_launched_,
        "withdraw": withdraw_,
        "complete_launched": complete_launched_,
        "track_uses": track_uses_,
        "untrack": untrack_,
        "is_live": is_live_,
        "writer_of": lambda buffer: writer_of(buffer),
        "readers_of": lambda buffer: readers_of(buffer),
        "storage_of": lambda buffer: storage_of(buffer),
        "PendingDispatch": pending_,
        "set_outcome": set_outcome_,
    }
