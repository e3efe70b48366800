# The native waiter threads of the compiled core (included by _core.pyx).

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
