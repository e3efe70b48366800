# Included by _core_plan.pxi at the place these stood (the names they use are imported there).

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
