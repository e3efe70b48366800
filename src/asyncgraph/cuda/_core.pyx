# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The dispatch core, compiled against ``cuda.bindings.cydriver``.

The twin of ``_core_py`` (read its docstring for the contract): the same :class:`Launcher`,
:func:`record` and :func:`query` (a launch returns the driver's code, a record or query the
one-element tuple ``cuda.bindings`` returns), and :class:`NativeWaiter`,
which only exists here. The driver is called straight from C, with no Python objects built
for the call's arguments; the launch releases the GIL (it blocks when the launch queue is
full).

:class:`NativeWaiter` runs one POSIX thread per lane. Each sleeps in ``cuEventSynchronize`` on
the event it was handed, with no Python thread state at all, and then writes to an eventfd
the event loop watches (``loop.add_reader``): the loop wakes in its selector, and a completion
never waits for the GIL to reach the loop.
"""

from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport calloc, free
from libc.errno cimport errno
from posix.unistd cimport read, write, close

from cuda.bindings cimport cydriver

cdef extern from "<sys/eventfd.h>" nogil:
    int eventfd(unsigned int initval, int flags)
    enum: EFD_NONBLOCK
    enum: EFD_CLOEXEC

cdef extern from "<pthread.h>" nogil:
    ctypedef unsigned long pthread_t
    ctypedef struct pthread_mutex_t:
        pass
    ctypedef struct pthread_cond_t:
        pass
    int pthread_create(pthread_t* thread, void* attr, void* (*start)(void*) noexcept nogil, void* arg)
    int pthread_join(pthread_t thread, void** retval)
    int pthread_mutex_init(pthread_mutex_t* mutex, void* attr)
    int pthread_mutex_destroy(pthread_mutex_t* mutex)
    int pthread_mutex_lock(pthread_mutex_t* mutex)
    int pthread_mutex_unlock(pthread_mutex_t* mutex)
    int pthread_cond_init(pthread_cond_t* cond, void* attr)
    int pthread_cond_destroy(pthread_cond_t* cond)
    int pthread_cond_wait(pthread_cond_t* cond, pthread_mutex_t* mutex)
    int pthread_cond_signal(pthread_cond_t* cond)

COMPILED = True

# How a parameter's slot is written: a pointer, or a value of one of these numpy types.
cdef enum Kind:
    K_POINTER
    K_BOOL
    K_INT8
    K_INT16
    K_INT32
    K_INT64
    K_UINT8
    K_UINT16
    K_UINT32
    K_UINT64
    K_FLOAT32
    K_FLOAT64

_KINDS = {
    "b1": K_BOOL,
    "i1": K_INT8,
    "i2": K_INT16,
    "i4": K_INT32,
    "i8": K_INT64,
    "u1": K_UINT8,
    "u2": K_UINT16,
    "u4": K_UINT32,
    "u8": K_UINT64,
    "f4": K_FLOAT32,
    "f8": K_FLOAT64,
}


cdef inline uintptr_t _address(object handle) except? 0:
    """The address a ``cuda.bindings`` handle (or an int) stands for."""
    return <uintptr_t>int(handle)


cdef class Launcher:
    """A loaded kernel's ``CUfunction`` and its parameter block, packed and launched in C.

    Args:
        function: the ``CUfunction`` (a ``cuda.bindings`` handle), kept alive here.
        params: the kernel's parameters (``supports`` them).
    """

    cdef cydriver.CUfunction _function
    cdef Py_ssize_t _n
    cdef uint8_t* _slots
    cdef void** _params
    cdef int* _kinds
    cdef readonly object function

    def __cinit__(self, function, params):
        cdef Py_ssize_t n = len(params)
        cdef Py_ssize_t i
        cdef Py_ssize_t room = n if n > 0 else 1
        self._n = n
        self._slots = <uint8_t*>calloc(room, 16)
        self._params = <void**>calloc(room, sizeof(void*))
        self._kinds = <int*>calloc(room, sizeof(int))
        if self._slots == NULL or self._params == NULL or self._kinds == NULL:
            raise MemoryError("no memory for a kernel's parameter block")
        for i in range(n):
            param = params[i]
            self._params[i] = self._slots + 16 * i
            if param.pointer:
                self._kinds[i] = K_POINTER
            else:
                kind = _KINDS.get(param.dtype.str[1:]) if param.dtype is not None else None
                if kind is None:
                    raise TypeError(f"cannot pack a parameter of C type {param.ctype!r}")
                self._kinds[i] = kind
        self.function = function
        self._function = <cydriver.CUfunction>_address(function)

    def __dealloc__(self):
        free(self._slots)
        free(self._params)
        free(self._kinds)

    @staticmethod
    def supports(params):
        """Whether a launcher can pack *params*: pointers and the numpy types of ``_KINDS``
        (the Python launcher packs any dtype of at most 16 bytes)."""
        return all(
            p.pointer or (p.dtype is not None and p.dtype.str[1:] in _KINDS) for p in params
        )

    cdef int _put(self, Py_ssize_t i, object value) except -1:
        cdef uint8_t* slot = self._slots + 16 * i
        cdef int kind = self._kinds[i]
        if kind == K_POINTER or kind == K_UINT64:
            (<uint64_t*>slot)[0] = <uint64_t>value
        elif kind == K_FLOAT32:
            (<float*>slot)[0] = <float><double>value
        elif kind == K_FLOAT64:
            (<double*>slot)[0] = <double>value
        elif kind == K_INT32:
            (<int32_t*>slot)[0] = <int32_t>value
        elif kind == K_INT64:
            (<int64_t*>slot)[0] = <int64_t>value
        elif kind == K_UINT32:
            (<uint32_t*>slot)[0] = <uint32_t>value
        elif kind == K_INT16:
            (<int16_t*>slot)[0] = <int16_t>value
        elif kind == K_UINT16:
            (<uint16_t*>slot)[0] = <uint16_t>value
        elif kind == K_INT8:
            (<int8_t*>slot)[0] = <int8_t>value
        elif kind == K_UINT8:
            (<uint8_t*>slot)[0] = <uint8_t>value
        else:  # K_BOOL
            (<uint8_t*>slot)[0] = 1 if value else 0
        return 0

    cdef int _pack(self, args, uint64_t base) except -1:
        cdef Py_ssize_t i = 0
        for arg in args:
            if i >= self._n:
                raise ValueError(f"{len(args)} arguments for {self._n} parameters")
            if arg.by_value:
                self._put(i, arg.value)
            else:
                (<uint64_t*>(self._slots + 16 * i))[0] = base + <uint64_t>arg.offset
            i += 1
        if i != self._n:
            raise ValueError(f"{i} arguments for {self._n} parameters")
        return 0

    cdef int _pack_values(self, values) except -1:
        cdef Py_ssize_t i
        if len(values) != self._n:
            raise ValueError(f"{len(values)} arguments for {self._n} parameters")
        for i in range(self._n):
            self._put(i, values[i])
        return 0

    def pack(self, args, uint64_t base):
        """Write *args* (a call's bound arguments; staged arrays lie at *base* + their
        offset) into the parameter block."""
        self._pack(args, base)

    def pack_values(self, values):
        """Write each argument's launch value (scalars, and pointers as ints)."""
        self._pack_values(values)

    def packed(self):
        """The parameter block's bytes, 16 per parameter."""
        return (<char*>self._slots)[: 16 * self._n]

    def launch(self, args, uint64_t base, tuple grid, tuple block, unsigned int shared_mem, stream):
        """:meth:`pack` *args* and launch on *stream*; the driver's code."""
        self._pack(args, base)
        return self._go(grid, block, shared_mem, stream)

    def launch_values(self, values, tuple grid, tuple block, unsigned int shared_mem, stream):
        """:meth:`pack_values` and launch on *stream*; the driver's code."""
        self._pack_values(values)
        return self._go(grid, block, shared_mem, stream)

    cdef int _go(self, tuple grid, tuple block, unsigned int shared_mem, stream) except? -1:
        cdef unsigned int gx = grid[0], gy = grid[1], gz = grid[2]
        cdef unsigned int bx = block[0], by = block[1], bz = block[2]
        cdef cydriver.CUstream handle = <cydriver.CUstream>_address(stream)
        cdef cydriver.CUresult code
        with nogil:
            code = cydriver.cuLaunchKernel(
                self._function, gx, gy, gz, bx, by, bz, shared_mem, handle, self._params, NULL
            )
        return <int>code


def record(event, stream):
    """``cuEventRecord(event, stream)``; ``(code,)``, as ``cuda.bindings`` returns it."""
    return (<int>cydriver.cuEventRecord(
        <cydriver.CUevent>_address(event), <cydriver.CUstream>_address(stream)
    ),)


def query(event):
    """``cuEventQuery(event)``; ``(code,)`` (``NOT_READY`` while it runs)."""
    return (<int>cydriver.cuEventQuery(<cydriver.CUevent>_address(event)),)


# -- the native waiter ---------------------------------------------------------------------------

cdef struct Slot:
    pthread_mutex_t mutex
    pthread_cond_t cond
    cydriver.CUevent event  # handed to the thread, not taken yet
    int handed
    int stop
    int done  # the thread finished waiting and its code is not taken yet
    int code
    int started
    pthread_t thread
    int fd
    cydriver.CUcontext context


cdef void* _wait_main(void* arg) noexcept nogil:
    """A waiter thread: sleep in ``cuEventSynchronize`` on each event handed to it, then
    record the code and write to the eventfd. No Python runs here."""
    cdef Slot* slot = <Slot*>arg
    cdef cydriver.CUevent event
    cdef cydriver.CUresult code
    cdef uint64_t one = 1
    cydriver.cuCtxSetCurrent(slot.context)
    pthread_mutex_lock(&slot.mutex)
    while True:
        while not slot.handed and not slot.stop:
            pthread_cond_wait(&slot.cond, &slot.mutex)
        if not slot.handed:
            break  # stopped, with nothing left to wait on
        event = slot.event
        slot.handed = 0
        pthread_mutex_unlock(&slot.mutex)
        code = cydriver.cuEventSynchronize(event)
        pthread_mutex_lock(&slot.mutex)
        slot.code = <int>code
        slot.done = 1
        pthread_mutex_unlock(&slot.mutex)
        write(slot.fd, &one, 8)
        pthread_mutex_lock(&slot.mutex)
    pthread_mutex_unlock(&slot.mutex)
    return NULL


cdef class NativeWaiter:
    """One waiter thread per lane, outside Python, waking the loop through an eventfd.

    Args:
        context: the CUDA context (a ``cuda.bindings`` handle) the threads make current.
        lanes: how many lanes there are.

    A lane is handed one event at a time (:meth:`hand`); once its thread returned from
    ``cuEventSynchronize`` the eventfd (:attr:`fd`) is readable and :meth:`take` reports the
    lane and the driver's code.
    """

    cdef Slot* _slots
    cdef int _n
    cdef readonly int fd
    cdef readonly object context

    def __cinit__(self, context, int lanes):
        cdef int i
        self.fd = -1
        if lanes < 1:
            raise ValueError(f"a native waiter needs at least one lane, not {lanes}")
        self._slots = <Slot*>calloc(lanes, sizeof(Slot))
        if self._slots == NULL:
            raise MemoryError("no memory for the waiter threads")
        self.fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)
        if self.fd < 0:
            raise OSError(errno, "eventfd failed")
        self.context = context
        for i in range(lanes):
            pthread_mutex_init(&self._slots[i].mutex, NULL)
            pthread_cond_init(&self._slots[i].cond, NULL)
            self._slots[i].fd = self.fd
            self._slots[i].context = <cydriver.CUcontext>_address(context)
        self._n = lanes

    def hand(self, int lane, event):
        """Wake lane *lane*'s thread (started on first use) to wait on *event*."""
        cdef Slot* slot
        cdef cydriver.CUevent handle = <cydriver.CUevent>_address(event)
        cdef int error
        if lane < 0 or lane >= self._n:
            raise IndexError(f"lane {lane} of {self._n}")
        slot = &self._slots[lane]
        if slot.stop:
            raise RuntimeError("the waiter threads were stopped: join() them first")
        with nogil:
            pthread_mutex_lock(&slot.mutex)
            slot.event = handle
            slot.handed = 1
            pthread_cond_signal(&slot.cond)
            pthread_mutex_unlock(&slot.mutex)
        if not slot.started:
            error = pthread_create(&slot.thread, NULL, _wait_main, slot)
            if error:
                slot.handed = 0
                raise OSError(error, "could not start a waiter thread")
            slot.started = 1

    def take(self):
        """``(lane, code)`` for each lane whose thread finished waiting since the last call."""
        cdef uint64_t count
        cdef int i
        cdef int done
        cdef int code
        cdef Slot* slot
        read(self.fd, &count, 8)  # non-blocking: clears the eventfd, or finds it clear
        finished = []
        for i in range(self._n):
            slot = &self._slots[i]
            with nogil:
                pthread_mutex_lock(&slot.mutex)
                done = slot.done
                code = slot.code
                slot.done = 0
                pthread_mutex_unlock(&slot.mutex)
            if done:
                finished.append((i, code))
        return finished

    def stop(self):
        """Ask every thread to exit once it waited on what it was handed; how many run."""
        cdef int i
        cdef int running = 0
        cdef Slot* slot
        for i in range(self._n):
            slot = &self._slots[i]
            if not slot.started:
                continue
            running += 1
            with nogil:
                pthread_mutex_lock(&slot.mutex)
                slot.stop = 1
                pthread_cond_signal(&slot.cond)
                pthread_mutex_unlock(&slot.mutex)
        return running

    def join(self):
        """Wait for the threads :meth:`stop` stopped (blocks: call it off the loop)."""
        cdef int i
        cdef Slot* slot
        for i in range(self._n):
            slot = &self._slots[i]
            if slot.started and slot.stop:
                with nogil:
                    pthread_join(slot.thread, NULL)
                slot.started = 0
                slot.stop = 0

    def __dealloc__(self):
        cdef int i
        if self._slots != NULL:
            self.stop()
            self.join()
            for i in range(self._n):
                pthread_mutex_destroy(&self._slots[i].mutex)
                pthread_cond_destroy(&self._slots[i].cond)
            free(self._slots)
        if self.fd >= 0:
            close(self.fd)
