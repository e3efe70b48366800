# The native waiter threads of the compiled core (included by _core_compiled.pyx).

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

cdef extern from "<pthread.h>" nogil:
    int pthread_detach(pthread_t thread)
    int pthread_cond_broadcast(pthread_cond_t* cond)
    int pthread_cond_timedwait(pthread_cond_t* cond, pthread_mutex_t* mutex, const timespec* at)

cdef extern from "<time.h>" nogil:
    enum: CLOCK_REALTIME
    int nanosleep(const timespec* req, timespec* rem)

cdef extern from "<sys/prctl.h>" nogil:
    int prctl(int option, unsigned long arg2, unsigned long arg3, unsigned long arg4,
              unsigned long arg5)
    enum: PR_SET_TIMERSLACK

from asyncgraph._cuda.core._watches import (
    EARLY_FRACTION, EARLY_MAX, EARLY_MIN, FOLLOW_FRACTION, FOLLOW_LONG_AFTER,
    FOLLOW_LONG_FRACTION, FOLLOW_LONG_MAX, FOLLOW_MAX, FOLLOW_MIN, SPIN_BEFORE_POKE
)

cdef double _FOLLOW_MIN = FOLLOW_MIN
cdef double _FOLLOW_MAX = FOLLOW_MAX
cdef double _FOLLOW_FRACTION = FOLLOW_FRACTION
cdef double _FOLLOW_LONG_AFTER = FOLLOW_LONG_AFTER
cdef double _FOLLOW_LONG_FRACTION = FOLLOW_LONG_FRACTION
cdef double _FOLLOW_LONG_MAX = FOLLOW_LONG_MAX
cdef double _SPIN_BEFORE_POKE = SPIN_BEFORE_POKE
cdef double _EARLY_MIN = EARLY_MIN
cdef double _EARLY_MAX = EARLY_MAX
cdef double _EARLY_FRACTION = EARLY_FRACTION


cdef inline double _seconds() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <double>ts.tv_sec + <double>ts.tv_nsec * 1e-9


cdef inline double _clamp(double value, double low, double high) noexcept nogil:
    return low if value < low else (high if value > high else value)


cdef cydriver.CUresult _follow(cydriver.CUevent event, double until) noexcept nogil:
    """``_waiters.follow``: wait for *event* by querying it after sleeps that grow with the time
    waited so far (``_watches.follow_step``), so the thread wakes within a small fraction of the
    wait after the GPU finished (past ``FOLLOW_LONG_AFTER``, in its longer steps). With *until*
    > 0 (a ``CLOCK_MONOTONIC`` time, ``perf_counter()``'s clock): only until then, in
    ``_watches.early_step``'s coarser steps and querying on the clock for the last
    ``SPIN_BEFORE_POKE``, returning ``CUDA_ERROR_NOT_READY`` then if it still runs."""
    cdef double start = _seconds()
    cdef double now, waited, step
    cdef cydriver.CUresult code
    cdef timespec pause
    while True:
        code = cydriver.cuEventQuery(event)
        if code != cydriver.CUDA_ERROR_NOT_READY:
            return code
        now = _seconds()
        if until > 0.0 and now >= until:
            return code
        waited = now - start
        if until > 0.0:
            step = _clamp(waited * _EARLY_FRACTION, _EARLY_MIN, _EARLY_MAX)
            if step > until - now - _SPIN_BEFORE_POKE:
                step = until - now - _SPIN_BEFORE_POKE
            if step <= 0.0:
                continue  # the last SPIN_BEFORE_POKE: querying on the clock
        elif waited > _FOLLOW_LONG_AFTER:
            step = _clamp(waited * _FOLLOW_LONG_FRACTION, _FOLLOW_MAX, _FOLLOW_LONG_MAX)
        else:
            step = _clamp(waited * _FOLLOW_FRACTION, _FOLLOW_MIN, _FOLLOW_MAX)
        pause.tv_sec = <long>step
        pause.tv_nsec = <long>((step - <double>pause.tv_sec) * 1e9)
        nanosleep(&pause, NULL)


cdef struct Slot:
    pthread_mutex_t mutex
    pthread_cond_t cond
    cydriver.CUevent event  # handed to the thread, not taken yet
    double wake_at  # when to poke the loop (CLOCK_MONOTONIC seconds); 0.0: never
    int handed
    int stop
    int done  # the thread finished waiting and its code is not taken yet
    double done_at  # when it saw the event complete (CLOCK_MONOTONIC seconds)
    int poked  # the thread woke the loop before the expected end, not taken yet
    int code
    int started
    int waiting  # following its event now
    int exited  # the thread is past its last use of the slot but the release of Shared
    pthread_t thread
    int fd
    cydriver.CUcontext context
    void* shared


cdef struct Shared:
    # The slots and the eventfd, shared by the NativeWaiter and its threads: the last of them
    # to let go frees them. A thread may outlive its NativeWaiter (blocked in the driver on a
    # kernel that never finishes): then it is detached, not joined.
    pthread_mutex_t mutex
    int refs
    int n
    int fd
    Slot* slots


cdef void _let_go(Shared* shared) noexcept nogil:
    """Drop one reference to *shared*; the last one frees it, and closes the eventfd."""
    cdef int i, last
    pthread_mutex_lock(&shared.mutex)
    shared.refs -= 1
    last = shared.refs == 0
    pthread_mutex_unlock(&shared.mutex)
    if not last:
        return
    for i in range(shared.n):
        pthread_mutex_destroy(&shared.slots[i].mutex)
        pthread_cond_destroy(&shared.slots[i].cond)
    if shared.fd >= 0:
        close(shared.fd)
    pthread_mutex_destroy(&shared.mutex)
    free(shared.slots)
    free(shared)


cdef void* _wait_main(void* arg) noexcept nogil:
    """A waiter thread: for each event handed to it, follow it until its wake time (if it has
    one, :func:`_follow` with it) and poke the loop if it still runs then, follow it until it
    completed, then record the code and write to the eventfd. No Python runs
    here."""
    cdef Slot* slot = <Slot*>arg
    cdef cydriver.CUevent event
    cdef double wake_at
    cdef cydriver.CUresult code
    cdef uint64_t one = 1
    cydriver.cuCtxSetCurrent(slot.context)
    # Sleeps of a few microseconds end on time only with a small timer slack (50 us by default).
    prctl(PR_SET_TIMERSLACK, 1000, 0, 0, 0)
    pthread_mutex_lock(&slot.mutex)
    while True:
        while not slot.handed and not slot.stop:
            pthread_cond_wait(&slot.cond, &slot.mutex)
        if not slot.handed:
            break  # stopped, with nothing left to wait on
        event = slot.event
        wake_at = slot.wake_at
        slot.handed = 0
        slot.waiting = 1
        pthread_mutex_unlock(&slot.mutex)
        code = cydriver.CUDA_ERROR_NOT_READY
        if wake_at > 0.0:
            code = _follow(event, wake_at)
        if code == cydriver.CUDA_ERROR_NOT_READY:
            if wake_at > 0.0:  # still running at its wake time: wake the loop for its end
                pthread_mutex_lock(&slot.mutex)
                slot.poked = 1
                pthread_mutex_unlock(&slot.mutex)
                write(slot.fd, &one, 8)
            code = _follow(event, 0.0)
        pthread_mutex_lock(&slot.mutex)
        slot.done_at = _seconds()
        slot.code = <int>code
        slot.done = 1
        slot.waiting = 0
        pthread_mutex_unlock(&slot.mutex)
        write(slot.fd, &one, 8)
        pthread_mutex_lock(&slot.mutex)
    slot.exited = 1
    pthread_cond_broadcast(&slot.cond)
    pthread_mutex_unlock(&slot.mutex)
    _let_go(<Shared*>slot.shared)
    return NULL


cdef class NativeWaiter:
    """One waiter thread per lane, outside Python, waking the loop through an eventfd.

    Args:
        context: the CUDA context (a ``cuda.bindings`` handle) the threads make current.
        lanes: how many lanes there are.

    A lane is handed one event at a time (:meth:`hand`); once its thread followed the event to
    its end (``_follow``) the eventfd (:attr:`fd`) is readable and :meth:`take` reports the
    lane and the driver's code. Nothing here waits without a bound for a thread still in the
    driver: :meth:`join` takes a timeout, and a waiter collected while a thread still waits
    (a kernel that never finishes) lets that thread go on by itself, detached; the last of
    them frees what they share.
    """

    cdef Shared* _shared
    cdef Slot* _slots
    cdef int _n
    cdef readonly int fd
    cdef readonly object context

    def __cinit__(self, context, int lanes):
        cdef int i
        self.fd = -1
        if lanes < 1:
            raise ValueError(f"a native waiter needs at least one lane, not {lanes}")
        self._shared = <Shared*>calloc(1, sizeof(Shared))
        if self._shared == NULL:
            raise MemoryError("no memory for the waiter threads")
        self._shared.fd = -1
        self._shared.refs = 1  # this object's
        pthread_mutex_init(&self._shared.mutex, NULL)
        self._slots = self._shared.slots = <Slot*>calloc(lanes, sizeof(Slot))
        if self._slots == NULL:
            raise MemoryError("no memory for the waiter threads")
        for i in range(lanes):
            pthread_mutex_init(&self._slots[i].mutex, NULL)
            pthread_cond_init(&self._slots[i].cond, NULL)
            self._slots[i].fd = -1
            self._slots[i].shared = self._shared
        self._n = self._shared.n = lanes
        self.fd = self._shared.fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)
        if self.fd < 0:
            raise OSError(errno, "eventfd failed")
        self.context = context
        for i in range(lanes):
            self._slots[i].fd = self.fd
            self._slots[i].context = <cydriver.CUcontext>_address(context)

    def hand(self, int lane, event, double wake_at=0.0):
        """Wake lane *lane*'s thread (started on first use) to wait on *event*, poking the
        loop at *wake_at* (``perf_counter()`` seconds) first if it is given."""
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
            slot.wake_at = wake_at
            slot.handed = 1
            pthread_cond_signal(&slot.cond)
            pthread_mutex_unlock(&slot.mutex)
        if not slot.started:
            pthread_mutex_lock(&self._shared.mutex)
            self._shared.refs += 1  # the thread's
            pthread_mutex_unlock(&self._shared.mutex)
            slot.exited = 0
            error = pthread_create(&slot.thread, NULL, _wait_main, slot)
            if error:
                slot.handed = 0
                _let_go(self._shared)  # not the last: this object holds one
                raise OSError(error, "could not start a waiter thread")
            slot.started = 1

    def take(self):
        """``(lane, None, 0.0)`` for each lane whose thread poked the loop since the last call,
        then ``(lane, code, seen)`` for each lane whose thread finished waiting (*seen*: when,
        in ``perf_counter()`` seconds)."""
        cdef uint64_t count
        cdef int i
        cdef int done, poked
        cdef int code
        cdef double seen
        cdef Slot* slot
        read(self.fd, &count, 8)  # non-blocking: clears the eventfd, or finds it clear
        finished = []
        for i in range(self._n):
            slot = &self._slots[i]
            with nogil:
                pthread_mutex_lock(&slot.mutex)
                done = slot.done
                poked = slot.poked
                code = slot.code
                seen = slot.done_at
                slot.done = slot.poked = 0
                pthread_mutex_unlock(&slot.mutex)
            if poked:
                finished.append((i, None, 0.0))
            if done:
                finished.append((i, code, seen))
        return finished

    def waiting(self):
        """How many threads follow an event now (work not finished yet)."""
        cdef int i, n = 0
        cdef Slot* slot
        for i in range(self._n):
            slot = &self._slots[i]
            with nogil:
                pthread_mutex_lock(&slot.mutex)
                n += slot.waiting or slot.handed
                pthread_mutex_unlock(&slot.mutex)
        return n

    def is_alive(self):
        """Whether a thread was started and not joined yet."""
        cdef int i
        for i in range(self._n):
            if self._slots[i].started:
                return True
        return False

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

    def join(self, timeout=None):
        """Wait for the threads :meth:`stop` stopped (blocks: call it off the loop), for at
        most *timeout* seconds if given; whether all of them exited. Those still waiting in
        the driver stay joinable (a later call, or the waiter's collection, takes them)."""
        cdef int i, exited, all_exited = 1
        cdef bint bounded = timeout is not None
        cdef double seconds = float(timeout) if bounded else 0.0
        cdef timespec at
        cdef Slot* slot
        if bounded:
            clock_gettime(CLOCK_REALTIME, &at)  # pthread_cond_timedwait's clock
            at.tv_sec += <long>seconds
            at.tv_nsec += <long>((seconds - <long>seconds) * 1e9)
            if at.tv_nsec >= 1000000000:
                at.tv_sec += 1
                at.tv_nsec -= 1000000000
        for i in range(self._n):
            slot = &self._slots[i]
            if not (slot.started and slot.stop):
                continue
            with nogil:
                pthread_mutex_lock(&slot.mutex)
                while not slot.exited:
                    if not bounded:
                        pthread_cond_wait(&slot.cond, &slot.mutex)
                    elif pthread_cond_timedwait(&slot.cond, &slot.mutex, &at) != 0:
                        break  # timed out (or failed): still in the driver
                exited = slot.exited
                pthread_mutex_unlock(&slot.mutex)
                if exited:
                    pthread_join(slot.thread, NULL)
            if exited:
                slot.started = 0
                slot.stop = 0
            else:
                all_exited = 0
        return bool(all_exited)

    def __dealloc__(self):
        cdef int i
        cdef Slot* slot
        if self._shared == NULL:
            return
        if self._slots != NULL:
            self.stop()
            for i in range(self._n):
                slot = &self._slots[i]
                if slot.started:
                    # Never waited for here: a thread still in the driver goes on by itself.
                    pthread_detach(slot.thread)
                    slot.started = 0
        _let_go(self._shared)
